package io.github.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.List;

import org.junit.jupiter.api.Test;

class RequestDocumentTest {
	private static byte[] b(String s) {
		return s.getBytes(StandardCharsets.UTF_8);
	}

	/** The server's fingerprint of a document. */
	private static String hash(String document) {
		return TestDb.value("SELECT encode(idem_hash(?::jsonb), 'hex')", document);
	}

	@Test
	void jsonBodyIsParsed() {
		String doc = RequestDocument.build("post", "/payments", "application/json; charset=utf-8",
			b("{\"order_id\": \"o-1\", \"amount\": 100}"), List.of());
		assertEquals("{\"method\":\"POST\",\"path\":\"/payments\",\"body\":{\"order_id\":\"o-1\",\"amount\":100}}", doc);
		assertEquals(doc, RequestDocument.build("POST", "/payments", "application/merge-patch+json",
			b("{\"order_id\": \"o-1\", \"amount\": 100}"), List.of()));
	}

	/** {"a": [[...]]}, arrays and objects nested levels deep */
	static String nested(int levels) {
		return "{\"a\": " + "[".repeat(levels - 1) + "]".repeat(levels - 1) + "}";
	}

	@Test
	void jsonNestedDeeperThan256LevelsIsBytesAsInEveryLanguage() {
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body\":" + nested(256).replace(" ", "") + "}",
			RequestDocument.build("POST", "/p", "application/json", b(nested(256)), List.of()));
		for (String body : List.of(nested(257), nested(5000)))
			assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\""
				+ Base64.getEncoder().encodeToString(b(body)) + "\"}",
				RequestDocument.build("POST", "/p", "application/json", b(body), List.of()));
		IdempotencyException e = assertThrows(IdempotencyException.class,
			() -> RequestDocument.build("POST", "/p", "application/json", b(nested(257)), List.of("/a")));
		assertEquals(ProblemCode.INVALID_REQUEST, e.code());
	}

	@Test
	void otherBodiesAreBase64() {
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"aGVsbG8=\"}",
			RequestDocument.build("POST", "/p", "text/plain", b("hello"), List.of()));
		// JSON content type that does not parse
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"eyJh\"}",
			RequestDocument.build("POST", "/p", "application/json", b("{\"a"), List.of()));
		// JSON that is not UTF-8 (a byte; UTF-16), or begins with a BOM, as the other languages take it
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"eyJhIjoi/yJ9\"}",
			RequestDocument.build("POST", "/p", "application/json",
				new byte[] {'{', '"', 'a', '"', ':', '"', (byte) 0xff, '"', '}'}, List.of()));
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"AFsAXQ==\"}",
			RequestDocument.build("POST", "/p", "application/json", "[]".getBytes(StandardCharsets.UTF_16BE), List.of()));
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"77u/e30=\"}",
			RequestDocument.build("POST", "/p", "application/json",
				new byte[] {(byte) 0xef, (byte) 0xbb, (byte) 0xbf, '{', '}'}, List.of()));
		// JSON that is not sent as JSON
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"e30=\"}",
			RequestDocument.build("POST", "/p", null, b("{}"), List.of()));
	}

	@Test
	void documentIsAsciiSoThatALoneSurrogateReachesTheServerAsItsEscape() {
		String doc = RequestDocument.build("POST", "/caf\u00e9", "application/json",
			b("{\"a\": \"\\ud800\", \"b\": \"\u00e9\u20ac\ud83d\ude00\"}"), List.of("/a", "/b"));
		assertEquals("{\"method\":\"POST\",\"path\":\"/caf\\u00E9\",\"body\":{\"/a\":\"\\uD800\","
			+ "\"/b\":\"\\u00E9\\u20AC\\uD83D\\uDE00\"}}", doc);
		// the same characters, the same fingerprint as the UTF-8 text
		assertEquals(hash("{\"method\": \"POST\", \"path\": \"/caf\u00e9\", \"body\": {\"/a\": null, "
			+ "\"/b\": \"\u00e9\u20ac\ud83d\ude00\"}}"),
			hash(RequestDocument.build("POST", "/caf\u00e9", "application/json",
				b("{\"b\": \"\u00e9\u20ac\ud83d\ude00\"}"), List.of("/a", "/b"))));
	}

	@Test
	void emptyBodyHasNeitherKey() {
		assertEquals("{\"method\":\"PATCH\",\"path\":\"/p\"}",
			RequestDocument.build("PATCH", "/p", "application/json", new byte[0], List.of()));
	}

	@Test
	void subsetPicksMembersAndNullForMissing() {
		String doc = RequestDocument.build("POST", "/payments", "application/json",
			b("{\"order_id\": \"o-1\", \"amount\": 100, \"note\": \"x\", \"a/b\": [1, 2]}"),
			List.of("/order_id", "/amount", "/missing", "/a~1b/1"));
		assertEquals("{\"method\":\"POST\",\"path\":\"/payments\",\"body\":{\"/order_id\":\"o-1\",\"/amount\":100,"
			+ "\"/missing\":null,\"/a~1b/1\":2}}", doc);
	}

	@Test
	void subsetOnNonJsonBodyIsInvalidRequest() {
		IdempotencyException e = assertThrows(IdempotencyException.class,
			() -> RequestDocument.build("POST", "/p", "text/plain", b("x"), List.of("/a")));
		assertEquals(ProblemCode.INVALID_REQUEST, e.code());
	}

	@Test
	void badPointerIsRefusedAtConfiguration() {
		assertThrows(IllegalArgumentException.class, () -> Route.defaults().withFingerprint("order_id"));
	}

	@Test
	void serverFingerprintIgnoresMemberOrderAndNumberSpelling() {
		String a = RequestDocument.build("POST", "/payments", "application/json",
			b("{\"order_id\": \"o-1\", \"amount\": 100}"), List.of());
		String b = RequestDocument.build("POST", "/payments", "application/json",
			b("{\"amount\":100.0,\"order_id\":\"o-1\"}"), List.of());
		String c = RequestDocument.build("POST", "/payments", "application/json",
			b("{\"amount\":101,\"order_id\":\"o-1\"}"), List.of());
		assertEquals(hash(a), hash(b));
		assertNotEquals(hash(a), hash(c));
		// the subset: members outside it do not count
		String s1 = RequestDocument.build("POST", "/payments", "application/json",
			b("{\"order_id\": \"o-1\", \"amount\": 100, \"note\": \"first\"}"), List.of("/amount", "/order_id"));
		String s2 = RequestDocument.build("POST", "/payments", "application/json",
			b("{\"note\": \"second\", \"order_id\": \"o-1\", \"amount\": 100}"), List.of("/order_id", "/amount"));
		assertEquals(hash(s1), hash(s2));
	}
}
