package io.github.pgidempotency.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.post;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.content;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.header;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.jsonPath;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.status;

import java.util.UUID;

import io.github.pgidempotency.spring.app.RaisingController;
import io.github.pgidempotency.spring.app.TestApplication;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.autoconfigure.web.servlet.AutoConfigureMockMvc;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.http.MediaType;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.test.web.servlet.MockMvc;
import org.springframework.test.web.servlet.request.MockHttpServletRequestBuilder;

/**
 * A raised exception that Spring MVC resolves to a 4xx (doc/clients.md,
 * "The request, step by step", item 5): rolled back and answered as
 * resolved, unless it is a final error (idempotency.final-errors, or an
 * IdempotencySettingsCustomizer's predicate); through MockMvc against the
 * real extension, counting rows, records and handler runs.
 */
@SpringBootTest(classes = TestApplication.class,
	properties = {"idempotency.final-errors=io.github.pgidempotency.spring.app.RaisingController$FinalRefused",
		"idempotency.time-limit=1s", "idempotency.max-request-body=1KB", "idempotency.max-stored-response=1KB"})
@AutoConfigureMockMvc
class RaisedErrorMockMvcTest {
	static final String BODY = "{\"order_id\": \"o-1\", \"amount\": 100}";

	@DynamicPropertySource
	static void database(DynamicPropertyRegistry registry) {
		registry.add("spring.datasource.url", () -> IdempotentMockMvcTest.URL);
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

	MockHttpServletRequestBuilder raise(String how) {
		return post("/raise/" + how).contentType(MediaType.APPLICATION_JSON).content(BODY)
			.header("Idempotency-Key", key).header("Authorization", "Bearer token-a");
	}

	long effects() {
		return jdbc.queryForObject("SELECT count(*) FROM spring_effects WHERE k = ?", Long.class, key);
	}

	long records() {
		return jdbc.queryForObject("SELECT count(*) FROM idem_keys WHERE key = ?", Long.class, key);
	}

	int calls() {
		var n = RaisingController.CALLS.get(key);
		return n == null ? 0 : n.get();
	}

	/**
	 * ResponseStatusException, an @ResponseStatus exception, an
	 * @ExceptionHandler's answer, and a ResponseStatusException from a
	 * @Transactional service that joined the key's transaction (which
	 * answered 500, UnexpectedRollbackException, before)
	 */
	@ParameterizedTest
	@ValueSource(strings = {"status", "annotated", "handled", "service"})
	void raisedErrorIsRolledBackAndAnsweredAsResolved(String how) throws Exception {
		for (int attempt = 1; attempt <= 2; attempt++) {
			mvc.perform(raise(how))
				.andExpect(status().isPaymentRequired())
				.andExpect(header().doesNotExist("Idempotent-Replayed"));
			assertEquals(0, effects());
			assertEquals(0, records());
			// the retry runs the handler again
			assertEquals(attempt, calls());
		}
	}

	@Test
	void exceptionHandlersBodyIsSent() throws Exception {
		mvc.perform(raise("handled"))
			.andExpect(status().isPaymentRequired())
			.andExpect(content().contentType(MediaType.APPLICATION_PROBLEM_JSON))
			.andExpect(jsonPath("$.code").value("card-declined"));
		assertEquals(0, records());
	}

	@Test
	void finalErrorFromThePropertyIsCompletedAndReplayed() throws Exception {
		mvc.perform(raise("final-handled"))
			.andExpect(status().isPaymentRequired())
			.andExpect(header().doesNotExist("Idempotent-Replayed"))
			.andExpect(jsonPath("$.code").value("card-declined"));
		assertEquals(1, effects());
		assertEquals("completed:402", jdbc.queryForObject(
			"SELECT status || ':' || response_status FROM idem_keys WHERE key = ?", String.class, key));
		long payment = jdbc.queryForObject("SELECT id FROM spring_effects WHERE k = ?", Long.class, key);
		mvc.perform(raise("final-handled"))
			.andExpect(status().isPaymentRequired())
			.andExpect(header().string("Idempotent-Replayed", "true"))
			.andExpect(content().contentType(MediaType.APPLICATION_PROBLEM_JSON))
			.andExpect(jsonPath("$.code").value("card-declined"))
			.andExpect(jsonPath("$.payment").value(payment));
		assertEquals(1, calls());
		assertEquals(1, effects());
		assertEquals(1, records());
	}

	@Test
	void finalErrorFromACustomizersPredicateIsCompletedAndReplayed() throws Exception {
		mvc.perform(raise("final-annotated")).andExpect(status().isPaymentRequired());
		mvc.perform(raise("final-annotated")).andExpect(status().isPaymentRequired())
			.andExpect(header().string("Idempotent-Replayed", "true"));
		assertEquals(1, calls());
		assertEquals(1, effects());
		assertEquals(1, records());
	}

	/**
	 * A final error thrown through a @Transactional service that joined the
	 * key's transaction: Spring marked it rollback-only, so nothing is
	 * stored; the client still gets the resolved 402.
	 */
	@Test
	void finalErrorWhoseTransactionCannotCommitIsRolledBackAndAnswered() throws Exception {
		for (int attempt = 1; attempt <= 2; attempt++) {
			mvc.perform(raise("final-service"))
				.andExpect(status().isPaymentRequired())
				.andExpect(header().doesNotExist("Idempotent-Replayed"))
				.andExpect(jsonPath("$.code").value("card-declined"));
			assertEquals(0, effects());
			assertEquals(0, records());
			assertEquals(attempt, calls());
		}
	}

	/** idempotency.time-limit (in this test's context): rolled back, the key freed, 503. */
	@Test
	void handlerPastTheTimeLimitIs503() throws Exception {
		mvc.perform(post("/payments/hung").contentType(MediaType.APPLICATION_JSON).content(BODY)
				.header("Idempotency-Key", key).header("Authorization", "Bearer token-a"))
			.andExpect(status().isServiceUnavailable())
			.andExpect(header().string("Retry-After", "1"))
			.andExpect(jsonPath("$.code").value("time-limit"));
		assertEquals(0, jdbc.queryForObject("SELECT count(*) FROM spring_effects WHERE k = ?", Long.class, key));
		assertEquals(0, records());
		// the pool serves the next request
		mvc.perform(raise("none")).andExpect(status().isOk());
	}

	/** idempotency.max-request-body and max-stored-response (1KB in this test's context). */
	@Test
	void sizeLimits() throws Exception {
		String over = "{\"pad\": \"" + "p".repeat(1025 - 11) + "\"}";
		String at = over.substring(0, 9) + over.substring(10);
		assertEquals(1025, over.length());
		assertEquals(1024, at.length());
		mvc.perform(post("/raise/none").contentType(MediaType.APPLICATION_JSON).content(over)
				.header("Idempotency-Key", key).header("Authorization", "Bearer token-a"))
			.andExpect(status().isPayloadTooLarge())
			.andExpect(jsonPath("$.code").value("payload-too-large"));
		assertEquals(0, calls());
		assertEquals(0, records());
		mvc.perform(post("/raise/none").contentType(MediaType.APPLICATION_JSON).content(at)
				.header("Idempotency-Key", key).header("Authorization", "Bearer token-a"))
			.andExpect(status().isOk());
		assertEquals(1, records());
		// a 2000-byte answer is over the stored-response limit: rolled back, 500
		key = key + "-big";
		mvc.perform(raise("big")).andExpect(status().isInternalServerError())
			.andExpect(jsonPath("$.code").value("internal-error"));
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void aReturnedAnswerIsStillCompleted() throws Exception {
		mvc.perform(raise("none")).andExpect(status().isOk());
		mvc.perform(raise("none")).andExpect(header().string("Idempotent-Replayed", "true"));
		assertEquals(1, effects());
		assertEquals(1, calls());
	}
}
