package io.github.pgidempotency;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A completed record's answer, as a replay sends it: the stored status, the
 * stored allow-listed headers and the body.
 *
 * @param status the stored {@code response_status}
 * @param headers lower-case header names to their values
 * @param body the body's bytes
 */
public record StoredResponse(int status, Map<String, String> headers, byte[] body) {
	/**
	 * A stored answer.
	 *
	 * @param status the stored {@code response_status}
	 * @param headers lower-case header names to their values
	 * @param body the body's bytes, or {@code null} for none
	 */
	public StoredResponse {
		headers = Collections.unmodifiableMap(new LinkedHashMap<>(headers));
		body = body == null ? new byte[0] : body;
	}
}
