package io.github.pgidempotency.spring;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Marks a controller method idempotent (on a class: its {@code POST} and
 * {@code PATCH} methods). The method runs inside the transaction that holds
 * the {@code Idempotency-Key}; its {@code JdbcTemplate} and
 * {@code @Transactional} code join that transaction, and its response is
 * stored and replayed.
 *
 * <pre>{@code
 * @PostMapping("/payments")
 * @Idempotent(operation = "create-payment", fingerprint = {"/order_id", "/amount"})
 * public ResponseEntity<Payment> create(@RequestBody PaymentRequest request) { ... }
 * }</pre>
 */
@Target({ElementType.METHOD, ElementType.TYPE})
@Retention(RetentionPolicy.RUNTIME)
@Documented
public @interface Idempotent {
	/**
	 * The operation name.
	 *
	 * @return the operation; empty for {@code METHOD path-template}
	 *         ({@code POST /payments/{id}})
	 */
	String operation() default "";

	/**
	 * The fingerprint subset.
	 *
	 * @return JSON Pointers (RFC 6901) of the body members that make two
	 *         requests the same; empty for the whole body
	 */
	String[] fingerprint() default {};

	/**
	 * Whether the key is required.
	 *
	 * @return {@link Key#REQUIRED} (a missing key is 400 {@code missing-key}),
	 *         {@link Key#OPTIONAL} (the method runs without idempotency), or
	 *         {@link Key#DEFAULT} ({@code idempotency.key-required})
	 */
	Key key() default Key.DEFAULT;

	/**
	 * How long a completed record replays.
	 *
	 * @return a duration such as {@code 24h} or {@code PT24H}; empty for
	 *         {@code idempotency.ttl}
	 */
	String ttl() default "";

	/** Whether a route requires the {@code Idempotency-Key}. */
	enum Key {
		/** As {@code idempotency.key-required} says (default: required). */
		DEFAULT,
		/** A missing key is 400 {@code missing-key}. */
		REQUIRED,
		/** A request without a key runs without idempotency. */
		OPTIONAL
	}
}
