package io.github.pgidempotency;

import java.util.Base64;
import java.util.List;
import java.util.Locale;

import com.fasterxml.jackson.core.JsonPointer;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.NullNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * The request document sent as {@code idem_reserve}'s {@code request}; the
 * server fingerprints it with {@code idem_hash} (RFC 8785 canonical form), so
 * every language computes the same fingerprint:
 * {@code {"method": "POST", "path": "/payments", "body": {...}}}.
 */
public final class RequestDocument {
	private RequestDocument() {
	}

	/**
	 * The document of a request.
	 *
	 * @param method the HTTP method (upper-cased here)
	 * @param path the request's path as sent, without the query string
	 * @param contentType the {@code Content-Type}, or {@code null}
	 * @param body the body's bytes ({@code null} or empty for none)
	 * @param subset the JSON Pointers (RFC 6901) of the members that make two
	 *        requests the same, or an empty list for the whole body
	 * @return the document, as JSON text
	 * @throws IdempotencyException {@link ProblemCode#INVALID_REQUEST} for a
	 *         subset on a body that is not JSON
	 */
	public static String build(String method, String path, String contentType, byte[] body,
		List<String> subset) {
		ObjectNode doc = Json.MAPPER.createObjectNode();
		doc.put("method", method.toUpperCase(Locale.ROOT));
		doc.put("path", path);
		JsonNode json = Json.isJsonMediaType(contentType) ? Json.parseBodyOrNull(body) : null;
		if (subset != null && !subset.isEmpty()) {
			if (json == null)
				throw new IdempotencyException(ProblemCode.INVALID_REQUEST,
					"The request body must be JSON: this route fingerprints members of it.");
			ObjectNode picked = doc.putObject("body");
			for (String pointer : subset) {
				JsonNode found = json.at(JsonPointer.compile(pointer));
				picked.set(pointer, found.isMissingNode() ? NullNode.getInstance() : found);
			}
		} else if (json != null) {
			doc.set("body", json);
		} else if (body != null && body.length > 0) {
			doc.put("body_base64", Base64.getEncoder().encodeToString(body));
		}
		return Json.asciiText(doc);
	}

	/**
	 * Checks a fingerprint subset, as a route is configured.
	 *
	 * @param subset JSON Pointers
	 * @return the same list, unmodifiable
	 * @throws IllegalArgumentException where one is not an RFC 6901 pointer
	 */
	public static List<String> checkSubset(List<String> subset) {
		if (subset == null)
			return List.of();
		for (String pointer : subset) {
			try {
				JsonPointer.compile(pointer);
			} catch (IllegalArgumentException e) {
				throw new IllegalArgumentException("fingerprint member \"" + pointer
					+ "\" is not a JSON Pointer (RFC 6901), such as \"/order_id\"", e);
			}
		}
		return List.copyOf(subset);
	}
}
