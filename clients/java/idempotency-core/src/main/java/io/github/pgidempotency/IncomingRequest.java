package io.github.pgidempotency;

import java.util.List;

/**
 * What the library reads of a request.
 *
 * @param method the HTTP method
 * @param path the request's path as sent, without the query string
 * @param keyFields the values of every {@code Idempotency-Key} field, in order
 * @param contentType the {@code Content-Type}, or {@code null}
 * @param body the body's bytes (empty for none)
 */
public record IncomingRequest(String method, String path, List<String> keyFields, String contentType,
	byte[] body) {
	/**
	 * A request.
	 *
	 * @param method the HTTP method
	 * @param path the path, without the query string
	 * @param keyFields the {@code Idempotency-Key} fields, or {@code null} for none
	 * @param contentType the {@code Content-Type}, or {@code null}
	 * @param body the body, or {@code null} for none
	 */
	public IncomingRequest {
		keyFields = keyFields == null ? List.of() : List.copyOf(keyFields);
		body = body == null ? new byte[0] : body;
	}
}
