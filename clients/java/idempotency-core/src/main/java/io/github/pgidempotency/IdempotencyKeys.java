package io.github.pgidempotency;

import java.util.List;
import java.util.Optional;

/**
 * The {@code Idempotency-Key} header, parsed as
 * draft-ietf-httpapi-idempotency-key-header defines it: one RFC 8941
 * sf-string ({@code "..."}, printable ASCII with {@code \"} and {@code \\} as
 * its only escapes), or the bare form (the value trimmed of spaces and tabs),
 * so that {@code "abc"} and {@code abc} are one key.
 */
public final class IdempotencyKeys {
	/** The header's name. */
	public static final String HEADER = "Idempotency-Key";

	private IdempotencyKeys() {
	}

	/**
	 * The key of a request.
	 *
	 * @param fields the values of every {@code Idempotency-Key} field of the
	 *        request, in order (an empty list or {@code null} when there is none)
	 * @return the key, or empty where the request has no such field
	 * @throws IdempotencyException {@link ProblemCode#INVALID_KEY} for more than
	 *         one field, a list, a malformed sf-string or an empty key
	 */
	public static Optional<String> parse(List<String> fields) {
		if (fields == null || fields.isEmpty())
			return Optional.empty();
		if (fields.size() > 1)
			throw invalid("The request has more than one Idempotency-Key field.");
		String value = trim(fields.get(0));
		String key = value.startsWith("\"") ? quoted(value) : bare(value);
		if (key.isEmpty())
			throw invalid("The Idempotency-Key is empty.");
		return Optional.of(key);
	}

	/** An sf-string: the characters between the quotes, unescaped. */
	private static String quoted(String value) {
		StringBuilder key = new StringBuilder(value.length());
		for (int i = 1; i < value.length(); i++) {
			char c = value.charAt(i);
			if (c == '\\') {
				char next = i + 1 < value.length() ? value.charAt(i + 1) : 0;
				if (next != '"' && next != '\\')
					throw invalid("The Idempotency-Key has an escape other than \\\" or \\\\.");
				key.append(next);
				i++;
			} else if (c == '"') {
				if (i != value.length() - 1)
					throw invalid("The Idempotency-Key has something after its closing quote.");
				return key.toString();
			} else if (c < 0x20 || c > 0x7E) {
				throw invalid("The Idempotency-Key has a character outside printable ASCII.");
			} else {
				key.append(c);
			}
		}
		throw invalid("The Idempotency-Key has no closing quote.");
	}

	/** The bare form: the value as it is, but never a list. */
	private static String bare(String value) {
		if (value.indexOf(',') >= 0)
			throw invalid("The Idempotency-Key field holds a list; send one key.");
		return value;
	}

	/** A field value without its leading and trailing spaces and tabs. */
	private static String trim(String value) {
		int start = 0;
		int end = value.length();
		while (start < end && (value.charAt(start) == ' ' || value.charAt(start) == '\t'))
			start++;
		while (end > start && (value.charAt(end - 1) == ' ' || value.charAt(end - 1) == '\t'))
			end--;
		return value.substring(start, end);
	}

	private static IdempotencyException invalid(String detail) {
		return new IdempotencyException(ProblemCode.INVALID_KEY, detail);
	}
}
