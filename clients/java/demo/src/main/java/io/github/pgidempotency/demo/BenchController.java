package io.github.pgidempotency.demo;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Map;

import javax.sql.DataSource;

import io.github.pgidempotency.spring.Idempotent;
import jakarta.servlet.http.HttpServletRequest;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.http.MediaType;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.support.TransactionTemplate;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * The overhead benchmark's two routes (--bench): one handler, an INSERT
 * into bench_effects answered with 201, behind the middleware and with the
 * three SQL calls written by hand on the same pool.
 */
@RestController
@ConditionalOnProperty(name = "demo.bench", havingValue = "true")
public class BenchController {
	private final JdbcTemplate jdbc;
	private final DataSource dataSource;
	private final Accounts accounts;
	private final TransactionTemplate tx;

	BenchController(JdbcTemplate jdbc, DataSource dataSource, Accounts accounts, PlatformTransactionManager tm) {
		this.tx = new TransactionTemplate(tm);
		this.jdbc = jdbc;
		this.dataSource = dataSource;
		this.accounts = accounts;
		try {
			jdbc.execute("CREATE TABLE IF NOT EXISTS bench_effects (id bigserial PRIMARY KEY, k text)");
		} catch (RuntimeException e) {
			System.err.println("demo: could not create bench_effects (" + e.getMessage() + "); it must exist");
		}
	}

	/**
	 * The handler behind the middleware.
	 *
	 * @param request the request
	 * @return 201 {"id": N}
	 */
	@PostMapping("/bench/middleware")
	@Idempotent(operation = "bench-middleware")
	public ResponseEntity<String> middleware(HttpServletRequest request) {
		Long id = jdbc.queryForObject("INSERT INTO bench_effects (k) VALUES (?) RETURNING id", Long.class,
			request.getHeader("Idempotency-Key"));
		return ResponseEntity.status(201).contentType(MediaType.APPLICATION_JSON).body("{\"id\": " + id + "}");
	}

	/**
	 * The same handler with idem_reserve, the INSERT and idem_complete by hand.
	 *
	 * @param body the request body (JSON)
	 * @param request the request
	 * @return 201, the replay, 409, 422, 400 or 401
	 * @throws SQLException on a database error
	 */
	@PostMapping("/bench/by-hand")
	public ResponseEntity<String> byHand(@RequestBody(required = false) byte[] body, HttpServletRequest request)
		throws SQLException {
		Call call = read(body, request);
		if (call.refusal() != null)
			return call.refusal();
		String scope = call.scope(), key = call.key(), json = call.json();
		try (Connection c = dataSource.getConnection()) {
			c.setAutoCommit(false);
			try {
				String outcome;
				int status;
				String response;
				try (PreparedStatement st = c.prepareStatement("SELECT outcome, response_status, (response -> 'body')::text "
					+ "FROM idem_reserve('bench-by-hand', ?, jsonb_build_object('method', 'POST', 'path', ?::text, "
					+ "'body', ?::jsonb), scope => ?)")) {
					st.setString(1, key);
					st.setString(2, request.getRequestURI());
					st.setString(3, json);
					st.setString(4, scope);
					try (ResultSet rs = st.executeQuery()) {
						rs.next();
						outcome = rs.getString(1);
						status = rs.getInt(2);
						response = rs.getString(3);
					}
				}
				if (!outcome.equals("new")) {
					c.rollback();
					return notNew(outcome, status, response);
				}
				long id;
				try (PreparedStatement st = c.prepareStatement("INSERT INTO bench_effects (k) VALUES (?) RETURNING id")) {
					st.setString(1, key);
					try (ResultSet rs = st.executeQuery()) {
						rs.next();
						id = rs.getLong(1);
					}
				}
				String answer = "{\"id\": " + id + "}";
				try (PreparedStatement st = c.prepareStatement(
					"SELECT idem_complete('bench-by-hand', ?, ?::jsonb, 201, scope => ?)")) {
					st.setString(1, key);
					st.setString(2, envelope(answer));
					st.setString(3, scope);
					st.execute();
				}
				c.commit();
				return plain(201, answer);
			} catch (SQLException | RuntimeException e) {
				c.rollback();
				throw e;
			} finally {
				c.setAutoCommit(true);
			}
		}
	}

	/**
	 * The same, the three calls by hand in Spring's way: a TransactionTemplate
	 * and the JdbcTemplate the handler uses, as {@code @Transactional} code
	 * would run them (the middleware's handler shares such a transaction).
	 *
	 * @param body the request body (JSON)
	 * @param request the request
	 * @return 201, the replay, 409, 422, 400 or 401
	 */
	@PostMapping("/bench/by-hand-tx")
	public ResponseEntity<String> byHandTx(@RequestBody(required = false) byte[] body, HttpServletRequest request) {
		Call call = read(body, request);
		if (call.refusal() != null)
			return call.refusal();
		String scope = call.scope(), k = call.key(), json = call.json();
		return tx.execute(status -> {
			Map<String, Object> r = jdbc.queryForMap("SELECT outcome, response_status, (response -> 'body')::text AS body "
				+ "FROM idem_reserve('bench-by-hand-tx', ?, jsonb_build_object('method', 'POST', 'path', ?::text, "
				+ "'body', ?::jsonb), scope => ?)", k, request.getRequestURI(), json, scope);
			String outcome = (String) r.get("outcome");
			if (!outcome.equals("new")) {
				Integer stored = (Integer) r.get("response_status");
				return notNew(outcome, stored == null ? 0 : stored, (String) r.get("body"));
			}
			Long id = jdbc.queryForObject("INSERT INTO bench_effects (k) VALUES (?) RETURNING id", Long.class, k);
			String answer = "{\"id\": " + id + "}";
			jdbc.queryForObject("SELECT idem_complete('bench-by-hand-tx', ?, ?::jsonb, 201, scope => ?)", Object.class, k,
				envelope(answer), scope);
			return plain(201, answer);
		});
	}

	/** What both by-hand routes read from a request: its scope, key and body, or the answer that refuses it. */
	private record Call(String scope, String key, String json, ResponseEntity<String> refusal) {
	}

	private Call read(byte[] body, HttpServletRequest request) {
		String scope = accounts.accountOf(request);
		if (scope == null)
			return new Call(null, null, null, plain(401, "{\"code\": \"unauthenticated\"}"));
		String key = request.getHeader("Idempotency-Key");
		if (key == null)
			return new Call(null, null, null, plain(400, "{\"code\": \"missing-key\"}"));
		key = key.trim();
		if (key.length() >= 2 && key.startsWith("\"") && key.endsWith("\""))
			key = key.substring(1, key.length() - 1);
		String json = body == null || body.length == 0 ? "null" : new String(body, StandardCharsets.UTF_8);
		return new Call(scope, key, json, null);
	}

	/** The answer of a by-hand route to an outcome other than new: the replay, 422 or 409 */
	private static ResponseEntity<String> notNew(String outcome, int status, String body) {
		return switch (outcome) {
			case "replay" -> ResponseEntity.status(status).header("Idempotent-Replayed", "true")
				.contentType(MediaType.APPLICATION_JSON).body(body);
			case "mismatch" -> plain(422, "{\"code\": \"mismatch\"}");
			default -> plain(409, "{\"code\": \"" + outcome + "\"}");
		};
	}

	/** The envelope the middleware stores (doc/clients.md), so that every route does the same work */
	private static String envelope(String answer) {
		return "{\"v\": 1, \"headers\": {\"content-type\": \"application/json\"}, \"body\": " + answer + "}";
	}

	private static ResponseEntity<String> plain(int status, String json) {
		return ResponseEntity.status(status).contentType(MediaType.APPLICATION_JSON).body(json);
	}
}
