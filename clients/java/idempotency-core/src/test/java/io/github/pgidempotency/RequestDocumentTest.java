package io.github.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
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

	@Test
	void otherBodiesAreBase64() {
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"aGVsbG8=\"}",
			RequestDocument.build("POST", "/p", "text/plain", b("hello"), List.of()));
		// JSON content type that does not parse
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"eyJh\"}",
			RequestDocument.build("POST", "/p", "application/json", b("{\"a"), List.of()));
		// JSON that is not sent as JSON
		assertEquals("{\"method\":\"POST\",\"path\":\"/p\",\"body_base64\":\"e30=\"}",
			RequestDocument.build("POST", "/p", null, b("{}"), List.of()));
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
