package io.github.pgidempotency.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.post;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.status;

import java.nio.charset.StandardCharsets;
import java.util.Base64;

import io.github.pgidempotency.spring.app.TestApplication;
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

/**
 * The nesting limit through MockMvc, against the server's smallest stack
 * (max_stack_depth = 100kB, about 600 levels): a body nested 256 levels deep
 * is JSON and the server takes it; one nested 257 levels is its bytes
 * (doc/clients.md, "The fingerprint").
 */
@SpringBootTest(classes = TestApplication.class,
	properties = "spring.datasource.hikari.connection-init-sql=SET max_stack_depth = '100kB'")
@AutoConfigureMockMvc
class ShallowStackMockMvcTest {
	@DynamicPropertySource
	static void database(DynamicPropertyRegistry registry) {
		registry.add("spring.datasource.url", () -> IdempotentMockMvcTest.URL);
	}

	@Autowired
	MockMvc mvc;

	@Autowired
	JdbcTemplate jdbc;

	@ParameterizedTest
	@ValueSource(ints = {256, 257})
	void nestingUpTo256LevelsIsJsonAndDeeperIsBytes(int levels) throws Exception {
		jdbc.execute("CREATE TABLE IF NOT EXISTS spring_effects (id bigserial PRIMARY KEY, k text, body text)");
		String key = "nested-" + levels;
		String body = "{\"order_id\": \"o-1\", \"x\": " + "[".repeat(levels - 1) + "]".repeat(levels - 1) + "}";
		String doc = levels == 256
			? "{\"method\": \"POST\", \"path\": \"/payments\", \"body\": " + body + "}"
			: "{\"method\": \"POST\", \"path\": \"/payments\", \"body_base64\": \""
				+ Base64.getEncoder().encodeToString(body.getBytes(StandardCharsets.UTF_8)) + "\"}";
		mvc.perform(post("/payments").contentType(MediaType.APPLICATION_JSON).content(body)
			.header("Idempotency-Key", key).header("Authorization", "Bearer token-a"))
			.andExpect(status().isCreated());
		assertEquals(1L, jdbc.queryForObject(
			"SELECT count(*) FROM spring_effects WHERE k = ?", Long.class, key));
		assertEquals(1L, jdbc.queryForObject(
			"SELECT count(*) FROM idem_keys WHERE key = ? AND request_hash = idem_hash(?::jsonb)", Long.class, key, doc));
	}
}
