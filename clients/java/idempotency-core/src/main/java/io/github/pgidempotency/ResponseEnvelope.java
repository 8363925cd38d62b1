package io.github.pgidempotency;

import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * The versioned JSON object stored in {@code idem_keys.response}, the same in
 * every language:
 * {@code {"v": 1, "headers": {"content-type": ..., "location": ...}, "body": ...}}
 * ({@code body_base64} instead of {@code body} for a body that is not JSON).
 */
public final class ResponseEnvelope {
	/** The envelope version this library writes and the highest it reads. */
	public static final int VERSION = 1;

	private ResponseEnvelope() {
	}

	/**
	 * The envelope of a handler's response.
	 *
	 * @param response the response
	 * @param replayHeaders the allow-list: lower-case names of the headers to store
	 * @return the envelope, as JSON text of ASCII only
	 * @throws UnsendableResponseException for a JSON body PostgreSQL cannot
	 *         store unchanged: a string or member name with U+0000 or a lone
	 *         surrogate
	 */
	public static String encode(CapturedResponse response, Set<String> replayHeaders) {
		ObjectNode env = Json.MAPPER.createObjectNode();
		env.put("v", VERSION);
		ObjectNode headers = env.putObject("headers");
		response.headers().forEach((name, values) -> {
			if (replayHeaders.contains(name) && !values.isEmpty())
				headers.put(name, String.join(", ", values));
		});
		byte[] body = response.body();
		JsonNode json = Json.isJsonMediaType(response.header("content-type")) ? Json.parseBodyOrNull(body) : null;
		if (json != null) {
			if (!storable(json))
				throw new UnsendableResponseException("the JSON response body has U+0000 or a lone surrogate, "
					+ "which PostgreSQL cannot store");
			env.set("body", json);
		} else if (body.length > 0)
			env.put("body_base64", Base64.getEncoder().encodeToString(body));
		return Json.asciiText(env);
	}

	/** Whether jsonb takes every string and member name of a value unchanged. */
	private static boolean storable(JsonNode node) {
		java.util.ArrayDeque<JsonNode> todo = new java.util.ArrayDeque<>();
		todo.push(node);
		while (!todo.isEmpty()) {
			JsonNode n = todo.pop();
			if (n.isTextual() && !storable(n.textValue()))
				return false;
			if (n.isObject()) {
				for (Map.Entry<String, JsonNode> m : n.properties()) {
					if (!storable(m.getKey()))
						return false;
					todo.push(m.getValue());
				}
			} else if (n.isArray())
				n.forEach(todo::push);
		}
		return true;
	}

	/** No U+0000 (jsonb has no NUL) and no lone surrogate (not UTF-8). */
	private static boolean storable(String s) {
		for (int i = 0; i < s.length(); i++) {
			char c = s.charAt(i);
			if (c == 0)
				return false;
			if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1)))
				i++;
			else if (Character.isSurrogate(c))
				return false;
		}
		return true;
	}

	/**
	 * The answer a replay sends.
	 *
	 * @param status the stored {@code response_status}
	 * @param response the stored {@code response} as text (jsonb's output), or {@code null}
	 * @param bodyText {@code response -> 'body'} as text (jsonb's output), or {@code null}
	 * @return the stored answer
	 * @throws IdempotencyException {@link ProblemCode#UNSUPPORTED_ENVELOPE} for an
	 *         envelope of a version above {@link #VERSION}
	 */
	public static StoredResponse decode(int status, String response, String bodyText) {
		Map<String, String> headers = new LinkedHashMap<>();
		if (response == null)
			return new StoredResponse(status, headers, null);
		JsonNode env = Json.parseOrNull(response.getBytes(StandardCharsets.UTF_8));
		if (env == null || !env.isObject() || !env.has("v")) {
			// A record completed by plain SQL: its response is the JSON body
			headers.put("content-type", "application/json");
			return new StoredResponse(status, headers, response.getBytes(StandardCharsets.UTF_8));
		}
		JsonNode v = env.get("v");
		if (!v.canConvertToExactIntegral() || v.asInt() != VERSION)
			throw new IdempotencyException(ProblemCode.UNSUPPORTED_ENVELOPE,
				"The stored response is a version " + v + " envelope; this library reads version "
					+ VERSION + ".");
		JsonNode stored = env.path("headers");
		for (Map.Entry<String, JsonNode> h : stored.properties()) {
			if (h.getValue().isTextual())
				headers.put(h.getKey().toLowerCase(java.util.Locale.ROOT), h.getValue().asText());
		}
		byte[] body = null;
		if (env.has("body"))
			body = (bodyText != null ? bodyText : Json.text(env.get("body"))).getBytes(StandardCharsets.UTF_8);
		else if (env.path("body_base64").isTextual())
			body = Base64.getDecoder().decode(env.get("body_base64").asText());
		return new StoredResponse(status, headers, body);
	}

	/**
	 * The default replay allow-list.
	 *
	 * @return {@code content-type} and {@code location}
	 */
	public static List<String> defaultReplayHeaders() {
		return List.of("content-type", "location");
	}
}
