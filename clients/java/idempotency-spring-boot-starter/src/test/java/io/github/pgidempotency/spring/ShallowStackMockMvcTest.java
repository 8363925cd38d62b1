package io.github.pgidempotency.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.post;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.content;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.jsonPath;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.status;

import io.github.pgidempotency.spring.app.TestApplication;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.autoconfigure.web.servlet.AutoConfigureMockMvc;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.http.MediaType;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.test.web.servlet.MockMvc;

/**
 * SQLSTATE 54001 through MockMvc: JSON nested 900 levels deep, which Jackson
 * takes (up to 1000) and the server's smallest stack does not (about 600
 * levels at max_stack_depth = 100kB; at the default 2 MB it takes more than
 * Jackson does).
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

	@Test
	void nestingDeeperThanTheServersStackIs400InvalidRequest() throws Exception {
		jdbc.execute("CREATE TABLE IF NOT EXISTS spring_effects (id bigserial PRIMARY KEY, k text, body text)");
		String body = "{\"order_id\": \"o-1\", \"x\": " + "[".repeat(900) + "]".repeat(900) + "}";
		mvc.perform(post("/payments").contentType(MediaType.APPLICATION_JSON).content(body)
			.header("Idempotency-Key", "shallow-stack").header("Authorization", "Bearer token-a"))
			.andExpect(status().isBadRequest())
			.andExpect(content().contentType("application/problem+json"))
			.andExpect(jsonPath("$.code").value("invalid-request"))
			.andExpect(jsonPath("$.detail").value("stack depth limit exceeded"));
		assertEquals(0L, jdbc.queryForObject(
			"SELECT count(*) FROM spring_effects WHERE k = 'shallow-stack'", Long.class));
		assertEquals(0L, jdbc.queryForObject(
			"SELECT count(*) FROM idem_keys WHERE key = 'shallow-stack'", Long.class));
	}
}
