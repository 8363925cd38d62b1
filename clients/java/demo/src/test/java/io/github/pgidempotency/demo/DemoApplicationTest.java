package io.github.pgidempotency.demo;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.get;
import static org.springframework.test.web.servlet.request.MockMvcRequestBuilders.post;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.content;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.header;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.jsonPath;
import static org.springframework.test.web.servlet.result.MockMvcResultMatchers.status;

import java.util.UUID;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
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

/** The demo's API (doc/clients.md) through MockMvc, on a database with clients/demo/schema.sql. */
@SpringBootTest(properties = "demo.bench=true")
@AutoConfigureMockMvc
class DemoApplicationTest {
	@DynamicPropertySource
	static void database(DynamicPropertyRegistry registry) {
		String url = System.getProperty("idempotency.test.url", "jdbc:postgresql://127.0.0.1:5432/idem_java_test");
		int q = url.indexOf('?');
		String demo = url.substring(0, q < 0 ? url.length() : q) + "_demo" + (q < 0 ? "" : url.substring(q));
		registry.add("spring.datasource.url", () -> demo);
	}

	@Autowired
	MockMvc mvc;

	@Autowired
	JdbcTemplate jdbc;

	String order;

	@BeforeEach
	void newOrder() {
		order = "o-" + UUID.randomUUID();
	}

	MockHttpServletRequestBuilder pay(String key, String token, long amount) {
		return post("/payments").contentType(MediaType.APPLICATION_JSON)
			.content("{\"order_id\": \"" + order + "\", \"amount\": " + amount + ", \"currency\": \"EUR\"}")
			.header("Idempotency-Key", key).header("Authorization", "Bearer " + token);
	}

	long payments(String status) {
		return jdbc.queryForObject("SELECT count(*) FROM payments WHERE order_id = ? AND status = ?", Long.class,
			order, status);
	}

	@Test
	void paymentReplayAndGet() throws Exception {
		MvcResult first = mvc.perform(pay(order, "token-a", 100))
			.andExpect(status().isCreated())
			.andExpect(jsonPath("$.status").value("paid"))
			.andExpect(jsonPath("$.order_id").value(order))
			.andReturn();
		String location = first.getResponse().getHeader("Location");
		mvc.perform(pay(order, "token-a", 100))
			.andExpect(status().isCreated())
			.andExpect(header().string("Idempotent-Replayed", "true"))
			.andExpect(header().string("Location", location))
			.andExpect(content().string(first.getResponse().getContentAsString()));
		assertEquals(1, payments("paid"));
		mvc.perform(get(location).header("Authorization", "Bearer token-a"))
			.andExpect(status().isOk()).andExpect(jsonPath("$.order_id").value(order));
		mvc.perform(get(location).header("Authorization", "Bearer token-b")).andExpect(status().isNotFound());
		mvc.perform(get(location)).andExpect(status().isUnauthorized());
		// the same key from account B is its own payment
		mvc.perform(pay(order, "token-b", 100)).andExpect(status().isCreated())
			.andExpect(header().doesNotExist("Idempotent-Replayed"));
		assertEquals(2, payments("paid"));
	}

	@Test
	void declinedIsInsertedCompletedAndReplayed() throws Exception {
		mvc.perform(pay(order, "token-a", 5_000_000)).andExpect(status().isPaymentRequired())
			.andExpect(content().contentType("application/problem+json"))
			.andExpect(jsonPath("$.code").value("card-declined"));
		mvc.perform(pay(order, "token-a", 5_000_000)).andExpect(status().isPaymentRequired())
			.andExpect(header().string("Idempotent-Replayed", "true"));
		assertEquals(1, payments("declined"));
	}

	@Test
	void notAPaymentIs400AndCompleted() throws Exception {
		for (int i = 0; i < 2; i++)
			mvc.perform(post("/payments").contentType(MediaType.APPLICATION_JSON)
				.content("{\"order_id\": \"" + order + "\", \"currency\": \"EUR\"}")
				.header("Idempotency-Key", order).header("Authorization", "Bearer token-a"))
				.andExpect(status().isBadRequest()).andExpect(jsonPath("$.code").value("bad-request"))
				.andExpect(i == 0 ? header().doesNotExist("Idempotent-Replayed")
					: header().string("Idempotent-Replayed", "true"));
		mvc.perform(pay(order, "nobody", 100)).andExpect(status().isUnauthorized())
			.andExpect(jsonPath("$.code").value("unauthenticated"));
		assertEquals(0, payments("paid"));
	}

	@Test
	void benchRoutes() throws Exception {
		for (String route : new String[] {"/bench/middleware", "/bench/by-hand", "/bench/by-hand-tx"}) {
			for (int i = 0; i < 2; i++)
				mvc.perform(post(route).contentType(MediaType.APPLICATION_JSON).content("{\"n\": 1}")
					.header("Idempotency-Key", order).header("Authorization", "Bearer token-a"))
					.andExpect(status().isCreated())
					.andExpect(i == 0 ? header().doesNotExist("Idempotent-Replayed")
						: header().string("Idempotent-Replayed", "true"));
		}
		assertEquals(3L, jdbc.queryForObject("SELECT count(*) FROM bench_effects WHERE k = ?", Long.class, order));
		// all three store the same envelope: the same work
		assertEquals("3 1", jdbc.queryForObject("SELECT count(*) || ' ' || count(DISTINCT response - 'body') "
			+ "FROM idem_keys WHERE key = ? AND response ->> 'v' = '1' AND response -> 'body' -> 'id' IS NOT NULL",
			String.class, order));
	}
}
