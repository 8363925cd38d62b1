package io.github.pgidempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Map;
import java.util.UUID;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import io.github.pgidempotency.IdempotencySettings;
import io.github.pgidempotency.Route;
import jakarta.servlet.ServletException;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import org.apache.catalina.Context;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/** The filter in a real servlet container (embedded Tomcat), against the real extension. */
class IdempotencyFilterTest {
	static final String URL = System.getProperty("idempotency.test.url",
		"jdbc:postgresql://127.0.0.1:5432/idem_java_test");
	static final Map<String, String> TOKENS = Map.of("token-a", "acct-a", "token-b", "acct-b");
	static final String BODY = "{\"order_id\": \"o-1\", \"amount\": 100}";

	static HikariDataSource pool;
	static Tomcat tomcat;
	static String base;
	static final HttpClient CLIENT = HttpClient.newHttpClient();

	String key;

	/** An error the application answers 402 itself. */
	static class Declined extends RuntimeException {
		private static final long serialVersionUID = 1L;
	}

	/** One the filter's settings mark final. */
	static final class FinalDeclined extends Declined {
		private static final long serialVersionUID = 1L;
	}

	/** The application: plain JDBC on the filter's connection. */
	static final class App extends HttpServlet {
		private static final long serialVersionUID = 1L;

		@Override
		protected void doGet(HttpServletRequest req, HttpServletResponse resp) throws IOException {
			resp.setContentType("text/plain");
			resp.getWriter().write("get " + (req.getAttribute(IdempotencyFilter.CONNECTION_ATTRIBUTE) != null));
		}

		@Override
		protected void doPost(HttpServletRequest req, HttpServletResponse resp) throws IOException, ServletException {
			String path = req.getRequestURI();
			String body = new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
			if (req.getAttribute(IdempotencyFilter.CONNECTION_ATTRIBUTE) == null) {
				resp.setContentType("text/plain");
				resp.getWriter().write("no transaction");
				return;
			}
			long id;
			try {
				Connection c = IdempotencyFilter.connection(req);
				try (PreparedStatement st = c.prepareStatement(
					"INSERT INTO servlet_effects (k, body) VALUES (?, ?) RETURNING id")) {
					st.setString(1, req.getHeader("Idempotency-Key"));
					st.setString(2, body);
					try (ResultSet rs = st.executeQuery()) {
						rs.next();
						id = rs.getLong(1);
					}
				}
			} catch (SQLException e) {
				throw new ServletException(e);
			}
			switch (path) {
				case "/fail" -> throw new ServletException("the processor is down");
				case "/declined" -> {
					resp.setStatus(402);
					resp.setContentType("application/problem+json");
					resp.getWriter().write("{\"code\": \"card-declined\"}");
				}
				case "/raised", "/raised-final" -> {
					// a framework that answers an exception itself says so
					IdempotencyFilter.raised(req, path.equals("/raised") ? new Declined() : new FinalDeclined());
					resp.setStatus(402);
					resp.setContentType("application/problem+json");
					resp.getWriter().write("{\"code\": \"card-declined\", \"payment\": " + id + "}");
				}
				// client text in a Location; a Content-Type Tomcat would write as '?'
				case "/unsendable" -> {
					resp.setStatus(201);
					resp.setHeader("Location", "/payments/" + body);
				}
				case "/unsendable-euro" -> {
					resp.setStatus(201);
					resp.setContentType("text/plain; note=\u20ac");
					resp.getWriter().write("ok");
				}
				case "/unavailable" -> resp.sendError(503, "try later");
				case "/text" -> {
					resp.setStatus(200);
					resp.setContentType("application/octet-stream");
					resp.getOutputStream().write(new byte[] {'o', 'k', 0, (byte) 0xfe});
				}
				default -> {
					resp.setStatus(201);
					resp.setHeader("Location", "/payments/" + id);
					resp.setHeader("X-Request-Id", UUID.randomUUID().toString());
					resp.setContentType("application/json");
					resp.getWriter().write("{\"id\": " + id + "}");
					if (path.equals("/slow")) {
						resp.flushBuffer();
						try {
							Thread.sleep(700);
						} catch (InterruptedException e) {
							Thread.currentThread().interrupt();
						}
					}
				}
			}
		}
	}

	@BeforeAll
	static void start() throws Exception {
		HikariConfig c = new HikariConfig();
		c.setJdbcUrl(URL);
		c.setMaximumPoolSize(4);
		pool = new HikariDataSource(c);
		sql("CREATE TABLE IF NOT EXISTS servlet_effects (id bigserial PRIMARY KEY, k text, body text)");

		IdempotencyFilter filter = IdempotencyFilter.builder(pool)
			.scope(req -> {
				String auth = req.getHeader("Authorization");
				return auth != null && auth.startsWith("Bearer ") ? TOKENS.get(auth.substring(7)) : null;
			})
			.routes(Routes.builder()
				.add("POST", "/payments", Route.named("create-payment"))
				.add("POST", "/orders/{id}/pay", Route.defaults())
				.add("POST", "/subset", Route.named("subset").withFingerprint("/order_id"))
				.add("POST", "/optional", Route.named("optional").withKeyRequired(false))
				.add("POST", "/fail", Route.defaults())
				.add("POST", "/declined", Route.defaults())
				.add("POST", "/raised", Route.defaults())
				.add("POST", "/unsendable", Route.defaults())
				.add("POST", "/unsendable-euro", Route.defaults())
				.add("POST", "/raised-final", Route.defaults())
				.add("POST", "/unavailable", Route.defaults())
				.add("POST", "/text", Route.defaults())
				.add("POST", "/slow", Route.defaults())
				.build())
			.settings(IdempotencySettings.builder().finalErrors(FinalDeclined.class).build())
			.build();

		tomcat = new Tomcat();
		tomcat.setBaseDir(Files.createTempDirectory("idem-tomcat").toString());
		tomcat.setHostname("127.0.0.1");
		tomcat.setPort(0);
		tomcat.getConnector().setProperty("address", "127.0.0.1");
		Context ctx = tomcat.addContext("", null);
		Tomcat.addServlet(ctx, "app", new App());
		ctx.addServletMappingDecoded("/*", "app");
		FilterDef def = new FilterDef();
		def.setFilterName("idempotency");
		def.setFilter(filter);
		ctx.addFilterDef(def);
		FilterMap map = new FilterMap();
		map.setFilterName("idempotency");
		map.addURLPattern("/*");
		ctx.addFilterMap(map);
		tomcat.start();
		base = "http://127.0.0.1:" + tomcat.getConnector().getLocalPort();
	}

	@AfterAll
	static void stop() throws Exception {
		tomcat.stop();
		tomcat.destroy();
		pool.close();
	}

	@BeforeEach
	void newKey() {
		key = "k-" + UUID.randomUUID();
	}

	static void sql(String sql) throws SQLException {
		try (Connection c = pool.getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
			st.execute();
		}
	}

	static String value(String sql, String arg) throws SQLException {
		try (Connection c = pool.getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
			st.setString(1, arg);
			try (ResultSet rs = st.executeQuery()) {
				return rs.next() ? rs.getString(1) : null;
			}
		}
	}

	long effects() throws SQLException {
		return Long.parseLong(value("SELECT count(*) FROM servlet_effects WHERE strpos(k, ?) > 0", key));
	}

	long records() throws SQLException {
		return Long.parseLong(value("SELECT count(*) FROM idem_keys WHERE key = ?", key));
	}

	static HttpRequest.Builder post(String path, String body, String... headers) {
		HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + path))
			.header("Content-Type", "application/json")
			.POST(HttpRequest.BodyPublishers.ofString(body));
		if (headers.length > 0)
			b.headers(headers);
		return b;
	}

	static HttpResponse<String> send(HttpRequest.Builder b) throws IOException, InterruptedException {
		return CLIENT.send(b.build(), HttpResponse.BodyHandlers.ofString());
	}

	HttpResponse<String> pay(String path, String body, String token) throws IOException, InterruptedException {
		return send(post(path, body, "Idempotency-Key", key, "Authorization", "Bearer " + token));
	}

	@Test
	void createdThenReplayedWithLocation() throws Exception {
		HttpResponse<String> first = pay("/payments", BODY, "token-a");
		assertEquals(201, first.statusCode());
		assertFalse(first.headers().firstValue("Idempotent-Replayed").isPresent());
		HttpResponse<String> second = pay("/payments", "{\"amount\":100,\"order_id\":\"o-1\"}", "token-a");
		assertEquals(201, second.statusCode());
		assertEquals("true", second.headers().firstValue("Idempotent-Replayed").orElse(null));
		assertEquals(first.headers().firstValue("Location"), second.headers().firstValue("Location"));
		assertTrue(second.headers().firstValue("Content-Type").orElse("").startsWith("application/json"));
		assertFalse(second.headers().firstValue("X-Request-Id").isPresent(), "not on the allow-list");
		assertEquals(first.body(), second.body());
		assertEquals(1, effects());
		assertEquals("create-payment", value("SELECT operation FROM idem_keys WHERE key = ?", key));
	}

	@Test
	void nonJsonBodyIsReplayedByteForByte() throws Exception {
		HttpRequest.Builder b = post("/text", "", "Idempotency-Key", key, "Authorization", "Bearer token-a");
		HttpResponse<byte[]> first = CLIENT.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
		HttpResponse<byte[]> second = CLIENT.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
		assertArrayEquals(new byte[] {'o', 'k', 0, (byte) 0xfe}, first.body());
		assertArrayEquals(first.body(), second.body());
		assertEquals("true", second.headers().firstValue("Idempotent-Replayed").orElse(null));
		assertEquals("application/octet-stream", second.headers().firstValue("Content-Type").orElse(null));
		assertEquals("b2sA/g==", value("SELECT response ->> 'body_base64' FROM idem_keys WHERE key = ?", key));
	}

	@Test
	void quotedAndBareKeyAreOneKey() throws Exception {
		assertEquals(201, send(post("/payments", BODY, "Idempotency-Key", "\"" + key + "\"",
			"Authorization", "Bearer token-a")).statusCode());
		HttpResponse<String> r = pay("/payments", BODY, "token-a");
		assertEquals("true", r.headers().firstValue("Idempotent-Replayed").orElse(null));
		assertEquals(1, records());
	}

	@Test
	void twoKeyFieldsAndBadEscapesAre400() throws Exception {
		HttpResponse<String> r = send(post("/payments", BODY, "Idempotency-Key", key, "Idempotency-Key", key,
			"Authorization", "Bearer token-a"));
		assertEquals(400, r.statusCode());
		assertEquals("application/problem+json", r.headers().firstValue("Content-Type").orElse(null));
		assertTrue(r.body().contains("\"code\":\"invalid-key\""), r.body());
		r = send(post("/payments", BODY, "Idempotency-Key", "\"a\\x\"", "Authorization", "Bearer token-a"));
		assertEquals(400, r.statusCode());
		assertTrue(r.body().contains("\"code\":\"invalid-key\""), r.body());
		r = send(post("/payments", BODY, "Authorization", "Bearer token-a"));
		assertEquals(400, r.statusCode());
		assertTrue(r.body().contains("\"code\":\"missing-key\""), r.body());
		assertEquals(0, records());
	}

	@Test
	void userBCannotReplayUserAsKey() throws Exception {
		assertEquals(201, pay("/payments", BODY, "token-a").statusCode());
		HttpResponse<String> b = pay("/payments", BODY, "token-b");
		assertEquals(201, b.statusCode());
		assertFalse(b.headers().firstValue("Idempotent-Replayed").isPresent());
		assertEquals(2, effects());
		HttpResponse<String> none = pay("/payments", BODY, "nobody");
		assertEquals(401, none.statusCode());
		assertTrue(none.body().contains("\"code\":\"unauthenticated\""));
	}

	@Test
	void handlerErrorRollsBack() throws Exception {
		HttpResponse<String> r = pay("/fail", BODY, "token-a");
		assertEquals(500, r.statusCode());
		assertTrue(r.body().contains("\"code\":\"internal-error\""), r.body());
		assertFalse(r.body().contains("processor"), "no internal detail");
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void sendErrorWithRetryableStatusRollsBack() throws Exception {
		assertEquals(503, pay("/unavailable", BODY, "token-a").statusCode());
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void declinedIsCompletedAndReplayed() throws Exception {
		assertEquals(402, pay("/declined", BODY, "token-a").statusCode());
		HttpResponse<String> r = pay("/declined", BODY, "token-a");
		assertEquals(402, r.statusCode());
		assertEquals("true", r.headers().firstValue("Idempotent-Replayed").orElse(null));
		assertEquals("{\"code\": \"card-declined\"}", r.body());
		assertEquals(1, effects());
	}

	@Test
	void raisedErrorIsRolledBackWhateverItsStatus() throws Exception {
		for (int attempt = 0; attempt < 2; attempt++) {
			HttpResponse<String> r = pay("/raised", BODY, "token-a");
			assertEquals(402, r.statusCode());
			assertFalse(r.headers().firstValue("Idempotent-Replayed").isPresent());
			assertTrue(r.body().contains("\"card-declined\""), r.body());
			assertEquals(0, effects());
			assertEquals(0, records());
		}
	}

	@Test
	void finalRaisedErrorIsCompletedAndReplayed() throws Exception {
		HttpResponse<String> first = pay("/raised-final", BODY, "token-a");
		assertEquals(402, first.statusCode());
		HttpResponse<String> r = pay("/raised-final", BODY, "token-a");
		assertEquals(402, r.statusCode());
		assertEquals("true", r.headers().firstValue("Idempotent-Replayed").orElse(null));
		assertEquals(first.body(), r.body());
		assertEquals(1, effects());
		assertEquals(1, records());
	}

	/** doc/clients.md, "Only what can be sent is committed", through a real server. */
	@ParameterizedTest
	@CsvSource({"/unsendable, '1\r\nSet-Cookie: a=b'", "/unsendable, 1\u20ac", "/unsendable-euro, ok"})
	void onlyWhatCanBeSentIsCommitted(String path, String body) throws Exception {
		for (int attempt = 1; attempt <= 2; attempt++) {
			HttpResponse<String> r = pay(path, body, "token-a");
			assertEquals(500, r.statusCode(), r.body());
			assertTrue(r.body().contains("\"code\":\"internal-error\""), r.body());
			assertFalse(r.headers().firstValue("Set-Cookie").isPresent());
			assertFalse(r.headers().firstValue("Location").isPresent());
			assertEquals(0, effects());
			assertEquals(0, records());
		}
	}

	static void update(String response, String key) throws SQLException {
		try (Connection c = pool.getConnection();
			PreparedStatement st = c.prepareStatement("UPDATE idem_keys SET response = ?::jsonb WHERE key = ?")) {
			st.setString(1, response);
			st.setString(2, key);
			assertEquals(1, st.executeUpdate());
		}
	}

	/** A record rewritten by SQL: only the allow-list, never framing headers, through a real server. */
	@Test
	void replayAppliesTheAllowListAndNeverFramingHeaders() throws Exception {
		assertEquals(201, pay("/payments", BODY, "token-a").statusCode());
		update("{\"v\": 1, \"headers\": {\"content-type\": \"application/json\", \"location\": \"/p/1\", "
			+ "\"set-cookie\": \"a=b\", \"content-length\": \"99\", \"transfer-encoding\": \"chunked\", "
			+ "\"connection\": \"close\", \"x-request-id\": \"s\"}, \"body\": {\"id\": 1}}", key);
		HttpResponse<String> r = pay("/payments", BODY, "token-a");
		assertEquals(201, r.statusCode());
		assertEquals("true", r.headers().firstValue("Idempotent-Replayed").orElse(null));
		assertEquals("{\"id\": 1}", r.body());
		assertEquals("/p/1", r.headers().firstValue("Location").orElse(null));
		assertEquals(String.valueOf(r.body().length()), r.headers().firstValue("Content-Length").orElse(null));
		for (String h : new String[] {"Set-Cookie", "Transfer-Encoding", "X-Request-Id"})
			assertFalse(r.headers().firstValue(h).isPresent(), h);
		update("{\"v\": 1, \"body_base64\": \"b2s\"}", key);
		r = pay("/payments", BODY, "token-a");
		assertEquals(500, r.statusCode());
		assertTrue(r.body().contains("\"code\":\"unsupported-envelope\""), r.body());
		assertEquals(1, effects());
	}

	/** The default 1 MiB request body limit: 413 before anything is reserved, with or without Content-Length. */
	@Test
	void bodyOverTheLimitIs413() throws Exception {
		byte[] over = new byte[1024 * 1024 + 1];
		java.util.Arrays.fill(over, (byte) 'x');
		for (HttpRequest.BodyPublisher body : new HttpRequest.BodyPublisher[] {
			HttpRequest.BodyPublishers.ofByteArray(over),
			HttpRequest.BodyPublishers.ofInputStream(() -> new java.io.ByteArrayInputStream(over))}) {
			HttpResponse<String> r = CLIENT.send(HttpRequest.newBuilder(URI.create(base + "/payments"))
				.header("Content-Type", "application/octet-stream").header("Idempotency-Key", key)
				.header("Authorization", "Bearer token-a").POST(body).build(), HttpResponse.BodyHandlers.ofString());
			assertEquals(413, r.statusCode(), r.body());
			assertTrue(r.body().contains("\"code\":\"payload-too-large\""), r.body());
		}
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void pathTemplateIsTheDefaultOperation() throws Exception {
		assertEquals(201, pay("/orders/17/pay", BODY, "token-a").statusCode());
		assertEquals("POST /orders/{id}/pay", value("SELECT operation FROM idem_keys WHERE key = ?", key));
	}

	@Test
	void fingerprintSubset() throws Exception {
		assertEquals(201, pay("/subset", "{\"order_id\": \"o-9\", \"note\": \"a\"}", "token-a").statusCode());
		HttpResponse<String> same = pay("/subset", "{\"order_id\": \"o-9\", \"note\": \"b\"}", "token-a");
		assertEquals("true", same.headers().firstValue("Idempotent-Replayed").orElse(null));
		HttpResponse<String> other = pay("/subset", "{\"order_id\": \"o-10\"}", "token-a");
		assertEquals(422, other.statusCode());
		assertTrue(other.body().contains("\"code\":\"mismatch\""));
		HttpRequest.Builder text = HttpRequest.newBuilder(URI.create(base + "/subset"))
			.header("Content-Type", "text/plain").header("Idempotency-Key", key + "-t")
			.header("Authorization", "Bearer token-a").POST(HttpRequest.BodyPublishers.ofString("x"));
		HttpResponse<String> bad = send(text);
		assertEquals(400, bad.statusCode());
		assertTrue(bad.body().contains("\"code\":\"invalid-request\""));
		assertEquals(1, effects());
	}

	/** Bodies the server cannot read (doc/clients.md, "Requests the server refuses"): 400 invalid-request. */
	@ParameterizedTest
	@CsvSource(delimiter = '|', textBlock = """
		{"order_id": "o-1", "x": "a\\u0000b"}   | unsupported Unicode escape sequence
		{"order_id": "o-1", "\\u0000": 1}       | unsupported Unicode escape sequence
		{"order_id": "o-1", "x": "\\ud800"}     | invalid input syntax for type json
		{"order_id": "o-1", "amount": 1e400}    | number 1e+400 is out of range for canonical JSON
		{"order_id": "o-1", "amount": 1e1000000} | value overflows numeric format
		""")
	void requestsTheServerRefusesAre400InvalidRequest(String body, String message) throws Exception {
		HttpResponse<String> r = pay("/payments", body, "token-a");
		assertEquals(400, r.statusCode(), r.body());
		assertEquals("application/problem+json", r.headers().firstValue("Content-Type").orElse(null));
		assertTrue(r.body().contains("\"code\":\"invalid-request\""), r.body());
		assertTrue(r.body().contains("\"detail\":\"" + message + "\""), r.body());
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void optionalKeyAndOtherMethodsPassThrough() throws Exception {
		HttpResponse<String> get = CLIENT.send(HttpRequest.newBuilder(URI.create(base + "/payments")).build(),
			HttpResponse.BodyHandlers.ofString());
		assertEquals("get false", get.body());
		HttpResponse<String> r = send(post("/optional", BODY, "Authorization", "Bearer token-a"));
		assertEquals(200, r.statusCode());
		assertEquals("no transaction", r.body());
		assertEquals(201, pay("/optional", BODY, "token-a").statusCode());
	}

	@Test
	void responseIsSentOnlyAfterCommit() throws Exception {
		HttpResponse<InputStream> r = CLIENT.send(post("/slow", BODY, "Idempotency-Key", key,
			"Authorization", "Bearer token-a").build(), HttpResponse.BodyHandlers.ofInputStream());
		// the handler flushed and then slept before returning: the headers
		// reach the client only once the record and the effect are committed
		String status = value("SELECT status FROM idem_keys WHERE key = ?", key);
		assertEquals("completed", status);
		assertEquals(1, effects());
		assertEquals(201, r.statusCode());
		r.body().close();
	}

	@Test
	void clientGoingAwayDoesNotCancelTheCommit() throws Exception {
		HttpRequest r = post("/slow", BODY, "Idempotency-Key", key, "Authorization", "Bearer token-a")
			.timeout(java.time.Duration.ofMillis(200)).build();
		assertThrows(java.net.http.HttpTimeoutException.class, () -> CLIENT.send(r, HttpResponse.BodyHandlers.ofString()));
		String status = null;
		for (int i = 0; i < 100 && !"completed".equals(status); i++) {
			Thread.sleep(100);
			status = value("SELECT status FROM idem_keys WHERE key = ?", key);
		}
		assertEquals("completed", status);
		HttpResponse<String> retry = pay("/slow", BODY, "token-a");
		assertEquals("true", retry.headers().firstValue("Idempotent-Replayed").orElse(null));
		assertEquals(1, effects());
	}

	@Test
	void filterNeedsAScopeAndChecksTheVersion() {
		IllegalStateException e = assertThrows(IllegalStateException.class,
			() -> IdempotencyFilter.builder(pool).build());
		assertTrue(e.getMessage().contains("scope"));
		int q = URL.indexOf('?');
		String noext = URL.substring(0, q < 0 ? URL.length() : q) + "_noext" + (q < 0 ? "" : URL.substring(q));
		HikariConfig c = new HikariConfig();
		c.setJdbcUrl(noext);
		try (HikariDataSource none = new HikariDataSource(c)) {
			e = assertThrows(IllegalStateException.class,
				() -> IdempotencyFilter.builder(none).scope(req -> "x").build());
			assertTrue(e.getMessage().contains("not installed"), e.getMessage());
		}
	}
}
