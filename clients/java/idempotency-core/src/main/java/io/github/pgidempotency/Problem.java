package io.github.pgidempotency;

import java.util.LinkedHashMap;
import java.util.Map;

import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * One RFC 9457 problem answer: its code, HTTP status, detail sentence and
 * {@code Retry-After} (seconds, or {@code null} for none).
 *
 * @param code the case
 * @param status the HTTP status
 * @param detail the {@code detail} sentence (never a stack trace)
 * @param retryAfter the {@code Retry-After} seconds, or {@code null}
 */
public record Problem(ProblemCode code, int status, String detail, Integer retryAfter) {
	/** The media type of a problem body. */
	public static final String CONTENT_TYPE = "application/problem+json";

	/**
	 * The problem document.
	 *
	 * @return {@code {"type", "title", "status", "detail", "code"}} as UTF-8 JSON
	 */
	public byte[] body() {
		ObjectNode n = Json.MAPPER.createObjectNode();
		n.put("type", code.type());
		n.put("title", code.title());
		n.put("status", status);
		n.put("detail", detail);
		n.put("code", code.code());
		return Json.bytes(n);
	}

	/**
	 * The headers of the answer: {@code content-type} and, where the case
	 * has one, {@code retry-after}.
	 *
	 * @return lower-case header names and their values
	 */
	public Map<String, String> headers() {
		Map<String, String> h = new LinkedHashMap<>();
		h.put("content-type", CONTENT_TYPE);
		if (retryAfter != null)
			h.put("retry-after", Integer.toString(retryAfter));
		return h;
	}
}
