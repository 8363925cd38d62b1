package io.github.pgidempotency.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.get;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.patch;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.post;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.content;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.header;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.jsonPath;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.status;

import java.util.UUID;
import java.util.stream.Stream;

import io.github.pgidempotency.spring.app.TestApplication;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;
import org.junit.jupiter.params.provider.ValueSource;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.autoconfigure.web.servlet.AutoConfigureMockMvc;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.http.MediaType;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.test.web.servlet.MockMvc;
import org.springframework.test.web.servlet.MvcResult;
import org.springframework.test.web.servlet.request.MockHttpServletRequestBuilder;

/** @Idempotent through MockMvc, against the real extension; effects counted in the database. */
@SpringBootTest(classes = TestApplication.class)
@AutoConfigureMockMvc
class IdempotentMockMvcTest {
	static final String URL = System.getProperty("idempotency.test.url",
		"jdbc:postgresql://127.0.0.1:5432/idem_java_test");
	static final String BODY = "{\"order_id\": \"o-1\", \"amount\": 100}";

	@DynamicPropertySource
	static void database(DynamicPropertyRegistry registry) {
		registry.add("spring.datasource.url", () -> URL);
	}

	@Autowired
	MockMvc mvc;

	@Autowired
	JdbcTemplate jdbc;

	String key;

	@BeforeEach
	void setUp() {
		jdbc.execute("CREATE TABLE IF NOT EXISTS spring_effects (id bigserial PRIMARY KEY, k text, body text)");
		key = "k-" + UUID.randomUUID();
	}

	MockHttpServletRequestBuilder pay(String path, String body, String token) {
		return post(path).contentType(MediaType.APPLICATION_JSON).content(body)
			.header("Idempotency-Key", key).header("Authorization", "Bearer " + token);
	}

	long effects() {
		return jdbc.queryForObject("SELECT count(*) FROM spring_effects WHERE strpos(k, ?) > 0", Long.class, key);
	}

	long records() {
		return jdbc.queryForObject("SELECT count(*) FROM idem_keys WHERE key = ?", Long.class, key);
	}

	@Test
	void createdThenReplayed() throws Exception {
		MvcResult first = mvc.perform(pay("/payments", BODY, "token-a"))
			.andExpect(status().isCreated())
			.andExpect(header().doesNotExist("Idempotent-Replayed"))
			.andExpect(jsonPath("$.seen").value(1))
			.andReturn();
		String location = first.getResponse().getHeader("Location");
		mvc.perform(pay("/payments", "{\"amount\": 100, \"order_id\": \"o-1\"}", "token-a"))
			.andExpect(status().isCreated())
			.andExpect(header().string("Idempotent-Replayed", "true"))
			.andExpect(header().string("Location", location))
			.andExpect(header().doesNotExist("X-Internal"))
			.andExpect(jsonPath("$.id").value(Long.parseLong(location.substring("/payments/".length()))));
		assertEquals(1, effects());
		assertEquals("create-payment:acct-a:completed:201", jdbc.queryForObject(
			"SELECT operation || ':' || scope || ':' || status || ':' || response_status FROM idem_keys WHERE key = ?",
			String.class, key));
	}

	@Test
	void quotedAndBareKeyAreOneKey() throws Exception {
		mvc.perform(post("/payments").contentType(MediaType.APPLICATION_JSON).content(BODY)
			.header("Idempotency-Key", "\"" + key + "\"").header("Authorization", "Bearer token-a"))
			.andExpect(status().isCreated());
		mvc.perform(pay("/payments", BODY, "token-a")).andExpect(header().string("Idempotent-Replayed", "true"));
		assertEquals(1, records());
	}

	@Test
	void keyErrors() throws Exception {
		mvc.perform(post("/payments").contentType(MediaType.APPLICATION_JSON).content(BODY)
			.header("Idempotency-Key", key, key).header("Authorization", "Bearer token-a"))
			.andExpect(status().isBadRequest())
			.andExpect(content().contentType("application/problem+json"))
			.andExpect(jsonPath("$.code").value("invalid-key"))
			.andExpect(jsonPath("$.status").value(400))
			.andExpect(jsonPath("$.type").value(
				"https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md#invalid-key"));
		mvc.perform(post("/payments").contentType(MediaType.APPLICATION_JSON).content(BODY)
			.header("Idempotency-Key", "\"a\\b\"").header("Authorization", "Bearer token-a"))
			.andExpect(status().isBadRequest()).andExpect(jsonPath("$.code").value("invalid-key"));
		mvc.perform(post("/payments").contentType(MediaType.APPLICATION_JSON).content(BODY)
			.header("Authorization", "Bearer token-a"))
			.andExpect(status().isBadRequest()).andExpect(jsonPath("$.code").value("missing-key"));
		key = "k".repeat(256);
		mvc.perform(pay("/payments", BODY, "token-a"))
			.andExpect(status().isBadRequest()).andExpect(jsonPath("$.code").value("invalid-request"))
			.andExpect(jsonPath("$.detail").value(org.hamcrest.Matchers.containsString("argument \"key\"")));
		assertEquals(0, effects());
	}

	/**
	 * JSON values every library takes that the server cannot read
	 * (doc/clients.md, "Requests the server refuses"), and its message.
	 */
	static Stream<Arguments> refusedValues() {
		return Stream.of(
			Arguments.of("\"a\\u0000b\"", "unsupported Unicode escape sequence"),
			Arguments.of("{\"\\u0000\": 1}", "unsupported Unicode escape sequence"),
			Arguments.of("\"\\ud800\"", "invalid input syntax for type json"),
			Arguments.of("1e400", "number 1e+400 is out of range for canonical JSON"),
			Arguments.of("1e1000000", "value overflows numeric format"));
	}

	@ParameterizedTest
	@MethodSource("refusedValues")
	void requestsTheServerRefusesAre400InvalidRequest(String value, String message) throws Exception {
		// in the whole body, and in the member a subset fingerprints
		for (String[] request : new String[][] {{"/payments", "{\"order_id\": \"o-1\", \"x\": " + value + "}"},
			{"/subset", "{\"order_id\": " + value + "}"}}) {
			mvc.perform(pay(request[0], request[1], "token-a"))
				.andExpect(status().isBadRequest())
				.andExpect(content().contentType("application/problem+json"))
				.andExpect(jsonPath("$.code").value("invalid-request"))
				.andExpect(jsonPath("$.detail").value(message));
		}
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@ParameterizedTest
	@ValueSource(strings = {"22P02", "22P05", "22003", "22021", "54001"})
	void theirSqlStatesFromTheHandlersOwnSqlToo(String state) throws Exception {
		mvc.perform(pay("/payments/sqlstate/" + state, BODY, "token-a"))
			.andExpect(status().isBadRequest())
			.andExpect(jsonPath("$.code").value("invalid-request"))
			.andExpect(jsonPath("$.detail").value("secret text"));
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void scopes() throws Exception {
		mvc.perform(pay("/payments", BODY, "token-a")).andExpect(status().isCreated());
		mvc.perform(pay("/payments", BODY, "token-b")).andExpect(status().isCreated())
			.andExpect(header().doesNotExist("Idempotent-Replayed"));
		mvc.perform(pay("/payments", BODY, "stolen")).andExpect(status().isUnauthorized())
			.andExpect(jsonPath("$.code").value("unauthenticated"));
		assertEquals(2, effects());
		assertEquals(2, records());
	}

	@Test
	void mismatchAndInProgress() throws Exception {
		mvc.perform(pay("/payments", BODY, "token-a")).andExpect(status().isCreated());
		mvc.perform(pay("/payments", "{\"order_id\": \"o-1\", \"amount\": 5}", "token-a"))
			.andExpect(status().isUnprocessableEntity()).andExpect(jsonPath("$.code").value("mismatch"));
		assertEquals(1, effects());
	}

	@Test
	void handlerExceptionRollsBackTheTransactionalWork() throws Exception {
		mvc.perform(pay("/payments/fail", BODY, "token-a"))
			.andExpect(status().isInternalServerError())
			.andExpect(jsonPath("$.code").value("internal-error"))
			.andExpect(jsonPath("$.detail").value(org.hamcrest.Matchers.not(
				org.hamcrest.Matchers.containsString("processor"))));
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void connectionLostBeforeCommitIs503Unavailable() throws Exception {
		for (int attempt = 0; attempt < 2; attempt++)
			mvc.perform(pay("/payments/terminated", BODY, "token-a"))
				.andExpect(status().isServiceUnavailable())
				.andExpect(header().string("Retry-After", "1"))
				.andExpect(jsonPath("$.code").value("unavailable"));
		assertEquals(0, effects());
		assertEquals(0, records());
		// and the pool serves the next request
		mvc.perform(pay("/payments", BODY, "token-a")).andExpect(status().isCreated());
	}

	@Test
	void retryableStatusRollsBack() throws Exception {
		mvc.perform(pay("/payments/unavailable", BODY, "token-a"))
			.andExpect(status().isServiceUnavailable()).andExpect(content().string("later"));
		assertEquals(0, effects());
		assertEquals(0, records());
		// the retry runs again
		mvc.perform(pay("/payments/unavailable", BODY, "token-a")).andExpect(status().isServiceUnavailable())
			.andExpect(header().doesNotExist("Idempotent-Replayed"));
	}

	@Test
	void finalFailureIsCompleted() throws Exception {
		mvc.perform(pay("/payments/declined", BODY, "token-a")).andExpect(status().isPaymentRequired());
		mvc.perform(pay("/payments/declined", BODY, "token-a")).andExpect(status().isPaymentRequired())
			.andExpect(header().string("Idempotent-Replayed", "true"))
			.andExpect(content().contentType("application/problem+json"))
			.andExpect(jsonPath("$.code").value("card-declined"));
		assertEquals(1, effects());
	}

	/** doc/clients.md, "Only what can be sent is committed": rolled back, 500, and the retry runs again. */
	@ParameterizedTest
	@ValueSource(strings = {"crlf", "euro-content-type", "header-name", "nul-body", "surrogate-body"})
	void onlyWhatCanBeSentIsCommitted(String what) throws Exception {
		for (int attempt = 1; attempt <= 2; attempt++) {
			mvc.perform(pay("/unsendable/" + what, "x\r\nSet-Cookie: a=b", "token-a"))
				.andExpect(status().isInternalServerError())
				.andExpect(content().contentType("application/problem+json"))
				.andExpect(jsonPath("$.code").value("internal-error"))
				.andExpect(header().doesNotExist("Set-Cookie"))
				.andExpect(header().doesNotExist("Location"));
			assertEquals(0, effects());
			assertEquals(0, records());
		}
	}

	/** A record rewritten by SQL: the allow-list applies at replay; an unreadable one is 500. */
	@Test
	void replayOnlyWhatIsAllowed() throws Exception {
		mvc.perform(pay("/payments", BODY, "token-a")).andExpect(status().isCreated());
		jdbc.update("UPDATE idem_keys SET response = ?::jsonb WHERE key = ?", "{\"v\": 1, \"headers\": "
			+ "{\"content-type\": \"application/json\", \"set-cookie\": \"a=b\", \"transfer-encoding\": \"chunked\", "
			+ "\"content-length\": \"99\", \"x-internal\": \"secret\"}, \"body\": {\"id\": 1}}", key);
		mvc.perform(pay("/payments", BODY, "token-a"))
			.andExpect(status().isCreated())
			.andExpect(header().string("Idempotent-Replayed", "true"))
			.andExpect(header().doesNotExist("Set-Cookie"))
			.andExpect(header().doesNotExist("Transfer-Encoding"))
			.andExpect(header().doesNotExist("X-Internal"))
			.andExpect(header().string("Content-Length", "9"))
			.andExpect(content().string("{\"id\": 1}"));
		jdbc.update("UPDATE idem_keys SET response = '{\"v\": \"1\", \"body\": {}}' WHERE key = ?", key);
		mvc.perform(pay("/payments", BODY, "token-a"))
			.andExpect(status().isInternalServerError())
			.andExpect(jsonPath("$.code").value("unsupported-envelope"));
		assertEquals(1, effects());
	}

	@Test
	void fingerprintSubsetAndNonJsonReplay() throws Exception {
		mvc.perform(pay("/subset", "{\"order_id\": \"o-7\", \"note\": \"a\"}", "token-a"))
			.andExpect(status().isCreated());
		mvc.perform(pay("/subset", "{\"note\": \"b\", \"order_id\": \"o-7\"}", "token-a"))
			.andExpect(status().isCreated())
			.andExpect(header().string("Idempotent-Replayed", "true"))
			.andExpect(content().contentTypeCompatibleWith(MediaType.TEXT_PLAIN))
			.andExpect(content().string("made " + key));
		mvc.perform(pay("/subset", "{\"order_id\": \"o-8\"}", "token-a"))
			.andExpect(status().isUnprocessableEntity());
		assertEquals(1, effects());
		assertEquals(1L, jdbc.queryForObject(
			"SELECT count(*) FROM idem_keys WHERE key = ? AND response ->> 'body_base64' IS NOT NULL", Long.class, key));
	}

	@Test
	void optionalKeyAndUnannotatedRoutes() throws Exception {
		mvc.perform(post("/optional").header("Authorization", "Bearer token-a"))
			.andExpect(status().isOk()).andExpect(content().string("transaction false"));
		mvc.perform(post("/optional").header("Idempotency-Key", key).header("Authorization", "Bearer token-a"))
			.andExpect(status().isOk()).andExpect(content().string("transaction true"));
		mvc.perform(post("/plain").header("Idempotency-Key", key + "-p"))
			.andExpect(status().isOk()).andExpect(content().string("transaction false"));
		assertEquals("POST /optional", jdbc.queryForObject(
			"SELECT operation FROM idem_keys WHERE key = ?", String.class, key));
	}

	@Test
	void requestsNoHandlerTakesAreSpringMvcs() throws Exception {
		mvc.perform(org.springframework.test.web.servlet.request.MockMvcRequestBuilders.put("/payments")
			.header("Idempotency-Key", key)).andExpect(status().isMethodNotAllowed());
		mvc.perform(post("/nowhere").header("Idempotency-Key", key)).andExpect(status().isNotFound());
		assertEquals(0, records());
	}

	@Test
	void classLevelAnnotationCoversPatchWithPathTemplate() throws Exception {
		mvc.perform(patch("/items/42").header("Idempotency-Key", key).header("Authorization", "Bearer token-a"))
			.andExpect(status().isOk()).andExpect(content().string("patched 42 true"));
		mvc.perform(patch("/items/42").header("Idempotency-Key", key).header("Authorization", "Bearer token-a"))
			.andExpect(header().string("Idempotent-Replayed", "true"));
		assertEquals("PATCH /items/{id}", jdbc.queryForObject(
			"SELECT operation FROM idem_keys WHERE key = ?", String.class, key));
		mvc.perform(get("/items/42").header("Idempotency-Key", key))
			.andExpect(status().isOk()).andExpect(content().string("item 42 false"));
	}
}
