package io.github.pgidempotency;

import java.time.Duration;
import java.util.List;

/**
 * The settings of one idempotent route; {@code null} members take the
 * {@link IdempotencySettings}' defaults.
 *
 * @param operation the operation name ({@code create-payment}); {@code null}
 *        for {@code METHOD path-template}
 * @param fingerprint JSON Pointers of the members that make two requests the
 *        same; empty for the whole body
 * @param keyRequired whether a missing key is 400 {@code missing-key} (rather
 *        than running the handler without idempotency); {@code null} for the default
 * @param ttl how long a completed record replays; {@code null} for the default
 */
public record Route(String operation, List<String> fingerprint, Boolean keyRequired, Duration ttl) {
	/**
	 * A route; the pointers and the ttl are checked.
	 *
	 * @param operation the operation, or {@code null}
	 * @param fingerprint JSON Pointers, or {@code null} for the whole body
	 * @param keyRequired whether the key is required, or {@code null}
	 * @param ttl the ttl, or {@code null}
	 */
	public Route {
		if (operation != null && operation.isEmpty())
			operation = null;
		fingerprint = RequestDocument.checkSubset(fingerprint);
		IdempotencySettings.checkTtl(ttl);
	}

	/** @return a route with every setting at its default */
	public static Route defaults() {
		return new Route(null, List.of(), null, null);
	}

	/**
	 * A route with an operation name and every other setting at its default.
	 *
	 * @param operation the operation, such as {@code create-payment}
	 * @return the route
	 */
	public static Route named(String operation) {
		return new Route(operation, List.of(), null, null);
	}

	/**
	 * This route with another operation.
	 *
	 * @param operation the operation, or {@code null} for {@code METHOD path-template}
	 * @return a new route
	 */
	public Route withOperation(String operation) {
		return new Route(operation, fingerprint, keyRequired, ttl);
	}

	/**
	 * This route with a fingerprint subset.
	 *
	 * @param pointers JSON Pointers such as {@code /order_id}
	 * @return a new route
	 */
	public Route withFingerprint(String... pointers) {
		return new Route(operation, List.of(pointers), keyRequired, ttl);
	}

	/**
	 * This route with the key required or optional.
	 *
	 * @param required whether a missing key is 400
	 * @return a new route
	 */
	public Route withKeyRequired(boolean required) {
		return new Route(operation, fingerprint, required, ttl);
	}

	/**
	 * This route with a ttl.
	 *
	 * @param ttl how long a completed record replays
	 * @return a new route
	 */
	public Route withTtl(Duration ttl) {
		return new Route(operation, fingerprint, keyRequired, ttl);
	}
}
