package io.github.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.junit.jupiter.api.Test;

class ResponseEnvelopeTest {
	private static final Set<String> ALLOW = Set.of("content-type", "location", "link");

	@Test
	void jsonBodyAndAllowListedHeaders() {
		CapturedResponse r = new CapturedResponse(201, Map.of("Content-Type", List.of("application/json"),
			"Location", List.of("/payments/42"), "Link", List.of("<a>", "<b>"), "Set-Cookie", List.of("s=1")),
			"{\"id\": 42}".getBytes(StandardCharsets.UTF_8));
		String env = ResponseEnvelope.encode(r, ALLOW);
		assertEquals(
			"{\"v\":1,\"headers\":{\"content-type\":\"application/json\",\"link\":\"<a>, <b>\",\"location\":\"/payments/42\"},\"body\":{\"id\":42}}",
			// header order follows the map's: compare as decoded
			ResponseEnvelope.encode(new CapturedResponse(201, new java.util.TreeMap<>(r.headers()), r.body()), ALLOW));
		StoredResponse s = ResponseEnvelope.decode(201, env, "{\"id\": 42}", ALLOW);
		assertEquals(201, s.status());
		assertEquals("/payments/42", s.headers().get("location"));
		assertEquals("<a>, <b>", s.headers().get("link"));
		assertEquals(null, s.headers().get("set-cookie"));
		assertArrayEquals("{\"id\": 42}".getBytes(StandardCharsets.UTF_8), s.body());
	}

	@Test
	void jsonBodyNestedDeeperThan256LevelsIsBase64AndOneAtTheLimitIsReadBack() {
		Map<String, List<String>> json = Map.of("content-type", List.of("application/json"));
		byte[] atLimit = RequestDocumentTest.nested(256).getBytes(StandardCharsets.UTF_8);
		String env = ResponseEnvelope.encode(new CapturedResponse(200, json, atLimit), ALLOW);
		assertEquals("{\"v\":1,\"headers\":{\"content-type\":\"application/json\"},\"body\":"
			+ RequestDocumentTest.nested(256).replace(" ", "") + "}", env);
		assertEquals(RequestDocumentTest.nested(256).replace(" ", ""),
			new String(ResponseEnvelope.decode(200, env, RequestDocumentTest.nested(256).replace(" ", ""), ALLOW).body(), StandardCharsets.UTF_8));
		byte[] beyond = RequestDocumentTest.nested(257).getBytes(StandardCharsets.UTF_8);
		String deeper = ResponseEnvelope.encode(new CapturedResponse(200, json, beyond), ALLOW);
		assertEquals("{\"v\":1,\"headers\":{\"content-type\":\"application/json\"},\"body_base64\":\""
			+ java.util.Base64.getEncoder().encodeToString(beyond) + "\"}", deeper);
		assertArrayEquals(beyond, ResponseEnvelope.decode(200, deeper, null, ALLOW).body());
	}

	@Test
	void nonJsonBodyIsBase64() {
		byte[] bytes = {0, 1, 2, (byte) 0xff};
		CapturedResponse r = new CapturedResponse(200, Map.of("content-type", List.of("application/octet-stream")), bytes);
		String env = ResponseEnvelope.encode(r, ALLOW);
		assertEquals("{\"v\":1,\"headers\":{\"content-type\":\"application/octet-stream\"},\"body_base64\":\"AAEC/w==\"}", env);
		assertArrayEquals(bytes, ResponseEnvelope.decode(200, env, null, ALLOW).body());
	}

	@Test
	void emptyBodyHasNeither() {
		String env = ResponseEnvelope.encode(new CapturedResponse(204, Map.of(), null), ALLOW);
		assertEquals("{\"v\":1,\"headers\":{}}", env);
		assertEquals(0, ResponseEnvelope.decode(204, env, null, ALLOW).body().length);
	}

	@Test
	void responseWithoutVersionIsJsonBody() {
		StoredResponse s = ResponseEnvelope.decode(201, "{\"id\": \"pay_1\"}", null, ALLOW);
		assertEquals("application/json", s.headers().get("content-type"));
		assertArrayEquals("{\"id\": \"pay_1\"}".getBytes(StandardCharsets.UTF_8), s.body());
	}

	@Test
	void higherVersionIsRefused() {
		IdempotencyException e = assertThrows(IdempotencyException.class,
			() -> ResponseEnvelope.decode(201, "{\"v\": 2, \"body\": {}}", "{}", ALLOW));
		assertEquals(ProblemCode.UNSUPPORTED_ENVELOPE, e.code());
	}
}
