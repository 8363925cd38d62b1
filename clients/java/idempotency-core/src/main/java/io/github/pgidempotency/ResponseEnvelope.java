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

	/**
	 * Framing and hop-by-hop headers: never stored or replayed, even when
	 * allow-listed (the server frames each answer itself).
	 */
	public static final Set<String> NEVER_REPLAYED = Set.of("content-length", "transfer-encoding", "connection",
		"keep-alive", "te", "trailer", "upgrade", "proxy-connection");

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
			if (replayHeaders.contains(name) && !NEVER_REPLAYED.contains(name) && !values.isEmpty())
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
	 * The answer a replay sends: the stored status and body, and the stored
	 * headers that are on the allow-list now, less the framing and hop-by-hop
	 * ones ({@link #NEVER_REPLAYED}), which the server writes itself.
	 *
	 * @param status the stored {@code response_status}
	 * @param response the stored {@code response} as text (jsonb's output), or {@code null}
	 * @param bodyText {@code response -> 'body'} as text (jsonb's output), or {@code null}
	 * @param replayHeaders the allow-list: lower-case names of the headers to send
	 * @return the stored answer
	 * @throws IdempotencyException {@link ProblemCode#UNSUPPORTED_ENVELOPE} for a
	 *         record this library cannot read (doc/clients.md, "The response
	 *         envelope"): a {@code v} that is not a number equal to
	 *         {@link #VERSION}, headers that are not an object of strings that
	 *         can be sent, both {@code body} and {@code body_base64}, a
	 *         {@code body_base64} that is not padded base64, or a status
	 *         outside 200 to 599
	 */
	public static StoredResponse decode(int status, String response, String bodyText, Set<String> replayHeaders) {
		if (status < 200 || status > 599)
			throw unreadable("Its status, " + status + ", is not from 200 to 599.");
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
		if (!v.isNumber() || !v.canConvertToExactIntegral() || v.asInt() != VERSION)
			throw new IdempotencyException(ProblemCode.UNSUPPORTED_ENVELOPE,
				"The stored response is a version " + v + " envelope; this library reads version "
					+ VERSION + ".");
		JsonNode stored = env.get("headers");
		if (stored != null && !stored.isObject())
			throw unreadable("Its \"headers\" is not an object.");
		if (stored != null) {
			for (Map.Entry<String, JsonNode> h : stored.properties()) {
				if (!h.getValue().isTextual() || !SendableResponse.isToken(h.getKey())
					|| !SendableResponse.isFieldValue(h.getValue().textValue()))
					throw unreadable("A header in it is not a string that can be sent.");
				String name = h.getKey().toLowerCase(java.util.Locale.ROOT);
				if (replayHeaders.contains(name) && !NEVER_REPLAYED.contains(name))
					headers.put(name, h.getValue().textValue());
			}
		}
		JsonNode base64 = env.get("body_base64");
		if (env.has("body") && base64 != null)
			throw unreadable("It has both \"body\" and \"body_base64\".");
		byte[] body = null;
		if (env.has("body"))
			body = (bodyText != null ? bodyText : Json.text(env.get("body"))).getBytes(StandardCharsets.UTF_8);
		else if (base64 != null) {
			// padded RFC 4648 base64 only (Java's decoder takes it unpadded too)
			if (!base64.isTextual() || base64.textValue().length() % 4 != 0)
				throw unreadable("Its \"body_base64\" is not padded base64.");
			try {
				body = Base64.getDecoder().decode(base64.textValue());
			} catch (IllegalArgumentException e) {
				throw unreadable("Its \"body_base64\" is not padded base64.");
			}
		}
		return new StoredResponse(status, headers, body);
	}

	private static IdempotencyException unreadable(String why) {
		return new IdempotencyException(ProblemCode.UNSUPPORTED_ENVELOPE,
			"The stored response is not an envelope this library can read. " + why);
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
