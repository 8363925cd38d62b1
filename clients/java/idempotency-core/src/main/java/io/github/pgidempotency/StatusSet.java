package io.github.pgidempotency;

import java.util.BitSet;
import java.util.Collection;
import java.util.List;

/**
 * A set of HTTP statuses, written as a list of codes and classes:
 * {@code "5xx, 408, 429"} (the default retryable statuses).
 */
public final class StatusSet {
	private static final StatusSet DEFAULT_RETRYABLE = parse(List.of("5xx", "408", "429"));

	private final BitSet statuses;
	private final String text;

	private StatusSet(BitSet statuses, String text) {
		this.statuses = statuses;
		this.text = text;
	}

	/** @return every 5xx, 408 and 429 */
	public static StatusSet defaultRetryable() {
		return DEFAULT_RETRYABLE;
	}

	/**
	 * A set from its items.
	 *
	 * @param items each a status ({@code 429}) or a class ({@code 5xx})
	 * @return the set
	 * @throws IllegalArgumentException for an item that is neither
	 */
	public static StatusSet parse(Collection<String> items) {
		BitSet set = new BitSet(600);
		for (String raw : items) {
			String item = raw.trim().toLowerCase(java.util.Locale.ROOT);
			if (item.isEmpty())
				continue;
			if (item.matches("[1-5]xx")) {
				int base = (item.charAt(0) - '0') * 100;
				set.set(base, base + 100);
			} else if (item.matches("[1-5][0-9][0-9]")) {
				set.set(Integer.parseInt(item));
			} else {
				throw new IllegalArgumentException("\"" + raw + "\" is not an HTTP status (429) or class (5xx)");
			}
		}
		return new StatusSet(set, String.join(", ", items));
	}

	/**
	 * A set from a comma-separated list.
	 *
	 * @param list such as {@code "5xx, 408, 429"}
	 * @return the set
	 */
	public static StatusSet parse(String list) {
		return parse(List.of(list.split(",")));
	}

	/**
	 * Whether a status is in the set.
	 *
	 * @param status an HTTP status
	 * @return whether it is
	 */
	public boolean contains(int status) {
		return status >= 0 && statuses.get(status);
	}

	@Override
	public String toString() {
		return text;
	}
}
