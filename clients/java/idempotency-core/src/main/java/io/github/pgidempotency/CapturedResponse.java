package io.github.pgidempotency;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The response a handler produced: its status, headers (names lower-cased)
 * and body bytes. The framework integrations capture it from a buffered
 * response; the core stores it as a {@link ResponseEnvelope}.
 *
 * @param status the HTTP status
 * @param headers lower-case header names to their values, in order
 * @param body the body's bytes (empty for none)
 */
public record CapturedResponse(int status, Map<String, List<String>> headers, byte[] body) {
	/**
	 * A response; header names are lower-cased and the maps copied.
	 *
	 * @param status the HTTP status
	 * @param headers header names to their values
	 * @param body the body's bytes, or {@code null} for none
	 */
	public CapturedResponse {
		Map<String, List<String>> copy = new LinkedHashMap<>();
		if (headers != null)
			headers.forEach((name, values) -> copy
				.computeIfAbsent(name.toLowerCase(Locale.ROOT), n -> new ArrayList<>())
				.addAll(values));
		copy.replaceAll((name, values) -> List.copyOf(values));
		headers = Collections.unmodifiableMap(copy);
		body = body == null ? new byte[0] : body;
	}

	/**
	 * The first value of a header.
	 *
	 * @param name its name, in any case
	 * @return the value, or {@code null}
	 */
	public String header(String name) {
		List<String> values = headers.get(name.toLowerCase(Locale.ROOT));
		return values == null || values.isEmpty() ? null : values.get(0);
	}
}
