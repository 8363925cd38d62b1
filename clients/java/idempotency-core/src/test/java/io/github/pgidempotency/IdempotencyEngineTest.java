package io.github.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;

import com.zaxxer.hikari.HikariDataSource;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The engine against the real extension: every row of the mapping, counted in the database. */
class IdempotencyEngineTest {
	private static final String BODY = "{\"order_id\": \"o-1\", \"amount\": 100}";

	private IdempotencyEngine engine;
	private String key;
	private final AtomicInteger calls = new AtomicInteger();

	@BeforeAll
	static void schema() {
		TestDb.sql("CREATE TABLE IF NOT EXISTS engine_effects (id bigserial PRIMARY KEY, k text NOT NULL, scope text)");
	}

	@BeforeEach
	void setUp() {
		engine = new IdempotencyEngine(IdempotencySettings.defaults(), new JdbcTransactionRunner(TestDb.pool()));
		key = "k-" + UUID.randomUUID();
	}

	private static IncomingRequest request(String keyField, String body) {
		return new IncomingRequest("POST", "/payments", keyField == null ? List.of() : List.of(keyField),
			"application/json", body == null ? null : body.getBytes(StandardCharsets.UTF_8));
	}

	/** A handler that inserts one effect on the key's connection and answers 201. */
	private IdempotencyEngine.Handler insert(String scope, int status) {
		return c -> {
			calls.incrementAndGet();
			long id;
			try (PreparedStatement st = c.prepareStatement(
				"INSERT INTO engine_effects (k, scope) VALUES (?, ?) RETURNING id")) {
				st.setString(1, key);
				st.setString(2, scope);
				try (ResultSet rs = st.executeQuery()) {
					rs.next();
					id = rs.getLong(1);
				}
			}
			return new CapturedResponse(status, Map.of("Content-Type", List.of("application/json"),
				"Location", List.of("/payments/" + id), "X-Private", List.of("no")),
				("{\"id\": " + id + "}").getBytes(StandardCharsets.UTF_8));
		};
	}

	private IdempotencyResult run(String scope, String body, IdempotencyEngine.Handler handler) {
		return engine.execute(request(key, body), Route.named("create-payment"), () -> scope, handler);
	}

	private long effects() {
		return TestDb.count("SELECT count(*) FROM engine_effects WHERE k = ?", key);
	}

	private long records() {
		return TestDb.count("SELECT count(*) FROM idem_keys WHERE key = ?", key);
	}

	private static Problem problem(IdempotencyResult r) {
		return assertInstanceOf(IdempotencyResult.Refused.class, r).problem();
	}

	@Test
	void newThenReplayWithStatusHeadersAndBody() {
		IdempotencyResult first = run("acct-a", BODY, insert("acct-a", 201));
		IdempotencyResult.Handled h = assertInstanceOf(IdempotencyResult.Handled.class, first);
		assertTrue(h.completed());
		assertEquals(201, h.status());
		assertEquals("completed:201", TestDb.value(
			"SELECT status || ':' || response_status FROM idem_keys WHERE key = ? AND scope = 'acct-a'"
				+ " AND operation = 'create-payment'", key));

		IdempotencyResult second = run("acct-a", "{\"amount\": 100.0, \"order_id\": \"o-1\"}", insert("acct-a", 201));
		StoredResponse s = assertInstanceOf(IdempotencyResult.Replayed.class, second).response();
		assertEquals(201, s.status());
		assertEquals(h.response().header("location"), s.headers().get("location"));
		assertEquals("application/json", s.headers().get("content-type"));
		assertNull(s.headers().get("x-private"));
		assertEquals(TestDb.value("SELECT (response -> 'body')::text FROM idem_keys WHERE key = ?", key),
			new String(s.body(), StandardCharsets.UTF_8));
		assertEquals(1, calls.get());
		assertEquals(1, effects());
	}

	@Test
	void quotedAndBareKeyAreOneKey() {
		engine.execute(request("\"" + key + "\"", BODY), Route.named("create-payment"), () -> "acct-a",
			insert("acct-a", 201));
		IdempotencyResult r = engine.execute(request(key, BODY), Route.named("create-payment"), () -> "acct-a",
			insert("acct-a", 201));
		assertInstanceOf(IdempotencyResult.Replayed.class, r);
		assertEquals(1, effects());
	}

	@Test
	void anotherScopeCannotReplayTheKey() {
		run("acct-a", BODY, insert("acct-a", 201));
		IdempotencyResult b = run("acct-b", BODY, insert("acct-b", 201));
		assertInstanceOf(IdempotencyResult.Handled.class, b);
		assertEquals(2, effects());
		assertEquals(1, TestDb.count("SELECT count(*) FROM engine_effects WHERE k = ? AND scope = 'acct-b'", key));
		assertEquals(2, records());
	}

	@Test
	void mismatchIs422() {
		run("acct-a", BODY, insert("acct-a", 201));
		Problem p = problem(run("acct-a", "{\"order_id\": \"o-1\", \"amount\": 99}", insert("acct-a", 201)));
		assertEquals(422, p.status());
		assertEquals(ProblemCode.MISMATCH, p.code());
		assertNull(p.retryAfter());
		assertEquals(1, effects());
	}

	@Test
	void inProgressIs409WithRetryAfter() throws SQLException {
		try (Connection other = TestDb.pool().getConnection()) {
			other.setAutoCommit(false);
			try (PreparedStatement st = other.prepareStatement(KeyRunner.RESERVE)) {
				st.setString(1, "create-payment");
				st.setString(2, key);
				st.setString(3, RequestDocument.build("POST", "/payments", "application/json",
					BODY.getBytes(StandardCharsets.UTF_8), List.of()));
				st.setString(4, "acct-a");
				st.setNull(5, java.sql.Types.VARCHAR);
				st.executeQuery().close();
			}
			Problem p = problem(run("acct-a", BODY, insert("acct-a", 201)));
			assertEquals(409, p.status());
			assertEquals(ProblemCode.IN_PROGRESS, p.code());
			assertEquals(1, p.retryAfter());
			assertTrue(new String(p.body(), StandardCharsets.UTF_8).contains("\"type\":\""
				+ ProblemCode.TYPE_BASE + "in-progress\""));
			other.rollback();
		}
		assertEquals(0, calls.get());
		assertEquals(0, records());
	}

	@Test
	void stuckIs409() {
		TestDb.sql("SELECT outcome FROM idem_reserve('create-payment', ?, ?::jsonb, scope => 'acct-a')", key,
			RequestDocument.build("POST", "/payments", "application/json", BODY.getBytes(StandardCharsets.UTF_8), List.of()));
		TestDb.sql("UPDATE idem_keys SET updated_at = updated_at - interval '1 day' WHERE key = ?", key);
		Problem p = problem(run("acct-a", BODY, insert("acct-a", 201)));
		assertEquals(409, p.status());
		assertEquals(ProblemCode.STUCK, p.code());
		assertEquals(1, p.retryAfter());
		assertEquals(0, effects());
	}

	@Test
	void handlerErrorRollsBackAndTheRetryRunsAgain() {
		Problem p = problem(run("acct-a", BODY, c -> {
			insert("acct-a", 201).handle(c);
			throw new IllegalStateException("the processor is down: secret detail");
		}));
		assertEquals(500, p.status());
		assertEquals(ProblemCode.INTERNAL_ERROR, p.code());
		assertTrue(!new String(p.body(), StandardCharsets.UTF_8).contains("secret"));
		assertEquals(0, effects());
		assertEquals(0, records());
		assertInstanceOf(IdempotencyResult.Handled.class, run("acct-a", BODY, insert("acct-a", 201)));
		assertEquals(1, effects());
	}

	@Test
	void retryableStatusRollsBackAndSendsTheHandlersAnswer() {
		IdempotencyResult r = run("acct-a", BODY, insert("acct-a", 503));
		IdempotencyResult.Handled h = assertInstanceOf(IdempotencyResult.Handled.class, r);
		assertEquals(503, h.status());
		assertTrue(!h.completed());
		assertEquals(0, effects());
		assertEquals(0, records());
		for (int status : new int[] {408, 429, 500}) {
			assertEquals(status, run("acct-a", BODY, insert("acct-a", status)).status());
			assertEquals(0, records());
		}
	}

	@Test
	void finalFailureIsCompletedAndReplayed() {
		assertEquals(402, run("acct-a", BODY, insert("acct-a", 402)).status());
		IdempotencyResult r = run("acct-a", BODY, insert("acct-a", 402));
		assertEquals(402, assertInstanceOf(IdempotencyResult.Replayed.class, r).status());
		assertEquals(1, effects());
	}

	/** An error a framework resolves to a 402 (a declined card). */
	static final class Declined extends RuntimeException {
		private static final long serialVersionUID = 1L;
	}

	/** A handler that inserts, then raises {@code error}, which its framework resolved to a 402. */
	private IdempotencyEngine.Handler insertThenRaise(RuntimeException error) {
		return c -> {
			CapturedResponse resolved = insert("acct-a", 402).handle(c);
			throw new RaisedError(error, resolved);
		};
	}

	@Test
	void raisedErrorRollsBackWhateverItsResolvedStatus() {
		IdempotencyResult r = run("acct-a", BODY, insertThenRaise(new Declined()));
		IdempotencyResult.Handled h = assertInstanceOf(IdempotencyResult.Handled.class, r);
		assertEquals(402, h.status());
		assertTrue(!h.completed());
		assertTrue(new String(h.response().body(), StandardCharsets.UTF_8).startsWith("{\"id\": "));
		assertEquals(0, effects());
		assertEquals(0, records());
		// the retry runs again
		assertInstanceOf(IdempotencyResult.Handled.class, run("acct-a", BODY, insertThenRaise(new Declined())));
		assertEquals(2, calls.get());
		assertEquals(0, records());
	}

	@Test
	void finalRaisedErrorIsCompletedWithItsResolvedAnswer() {
		engine = new IdempotencyEngine(IdempotencySettings.builder().finalErrors(Declined.class).build(),
			new JdbcTransactionRunner(TestDb.pool()));
		IdempotencyResult.Handled h = assertInstanceOf(IdempotencyResult.Handled.class,
			run("acct-a", BODY, insertThenRaise(new Declined())));
		assertTrue(h.completed());
		StoredResponse s = assertInstanceOf(IdempotencyResult.Replayed.class,
			run("acct-a", BODY, insertThenRaise(new Declined()))).response();
		assertEquals(402, s.status());
		assertEquals(h.response().header("location"), s.headers().get("location"));
		assertEquals(1, calls.get());
		assertEquals(1, effects());
		assertEquals(1, records());
		// another type is not final; a predicate adds to the types
		key = "k-" + UUID.randomUUID();
		run("acct-a", BODY, insertThenRaise(new IllegalStateException()));
		assertEquals(0, records());
		engine = new IdempotencyEngine(IdempotencySettings.builder().finalErrors(Declined.class)
			.finalErrors(e -> e instanceof IllegalStateException).build(), new JdbcTransactionRunner(TestDb.pool()));
		run("acct-a", BODY, insertThenRaise(new IllegalStateException()));
		assertEquals(1, records());
	}

	@Test
	void finalRaisedErrorThatCannotCommitIsRolledBackAndAnswered() {
		engine = new IdempotencyEngine(IdempotencySettings.builder().finalErrors(Declined.class).build(),
			new JdbcTransactionRunner(TestDb.pool()));
		// the handler's own SQL failed and aborted the transaction; its framework answered 402
		IdempotencyResult r = run("acct-a", BODY, c -> {
			CapturedResponse resolved = insert("acct-a", 402).handle(c);
			try (PreparedStatement st = c.prepareStatement("SELECT 1 / 0")) {
				st.execute();
			} catch (SQLException e) {
				throw new RaisedError(new Declined(), resolved);
			}
			throw new IllegalStateException("unreachable");
		});
		IdempotencyResult.Handled h = assertInstanceOf(IdempotencyResult.Handled.class, r);
		assertEquals(402, h.status());
		assertTrue(!h.completed());
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void raisedErrorWithoutAKeyIsAnsweredAsResolved() {
		IdempotencyResult r = engine.execute(request(null, BODY), Route.defaults().withKeyRequired(false),
			() -> "acct-a", c -> {
				throw new RaisedError(new Declined(), new CapturedResponse(402, Map.of(), null));
			});
		assertEquals(402, assertInstanceOf(IdempotencyResult.Handled.class, r).status());
	}

	/** Responses no server here writes unchanged, or that jsonb cannot store unchanged. */
	static java.util.stream.Stream<CapturedResponse> unsendable() {
		byte[] ok = "{}".getBytes(StandardCharsets.UTF_8);
		Map<String, List<String>> json = Map.of("content-type", List.of("application/json"));
		return java.util.stream.Stream.of(
			new CapturedResponse(201, Map.of("location", List.of("/payments/1\r\nSet-Cookie: a=b")), ok),
			new CapturedResponse(201, Map.of("location", List.of("/payments/1\n")), ok),
			new CapturedResponse(201, Map.of("x-note", List.of("a\u0000b")), ok),
			new CapturedResponse(201, Map.of("content-type", List.of("application/json; charset=\u20ac")), ok),
			new CapturedResponse(201, Map.of("x-note", List.of("caf\u00e9")), ok),
			new CapturedResponse(201, Map.of("bad name", List.of("x")), ok),
			new CapturedResponse(201, Map.of("", List.of("x")), ok),
			new CapturedResponse(201, Map.of("x-a:b", List.of("x")), ok),
			new CapturedResponse(600, Map.of(), ok),
			new CapturedResponse(101, Map.of(), ok),
			new CapturedResponse(201, json, "{\"a\": \"x\\u0000y\"}".getBytes(StandardCharsets.UTF_8)),
			new CapturedResponse(201, json, "{\"\\u0000\": 1}".getBytes(StandardCharsets.UTF_8)),
			new CapturedResponse(201, json, "[\"\\ud800\"]".getBytes(StandardCharsets.UTF_8)),
			new CapturedResponse(201, json, "{\"a\": [\"\\udc00x\"]}".getBytes(StandardCharsets.UTF_8)));
	}

	@org.junit.jupiter.params.ParameterizedTest
	@org.junit.jupiter.params.provider.MethodSource("unsendable")
	void onlyWhatCanBeSentIsCommitted(CapturedResponse bad) {
		for (int attempt = 1; attempt <= 2; attempt++) {
			Problem p = problem(run("acct-a", BODY, c -> {
				insert("acct-a", 201).handle(c);
				return bad;
			}));
			assertEquals(500, p.status());
			assertEquals(ProblemCode.INTERNAL_ERROR, p.code());
			assertEquals(0, effects());
			assertEquals(0, records());
			// the retry runs the handler again
			assertEquals(attempt, calls.get());
		}
	}

	@Test
	void whatCanBeSentIsStoredUnchanged() {
		// tabs and spaces inside a value, a surrogate pair, non-ASCII text in a JSON body
		CapturedResponse good = new CapturedResponse(201, Map.of("content-type", List.of("application/json"),
			"location", List.of("/p/1 \t2"), "x-t~k!n", List.of("")),
			"{\"s\": \"caf\u00e9 \\ud83d\\ude00 \u20ac\"}".getBytes(StandardCharsets.UTF_8));
		run("acct-a", BODY, c -> good);
		StoredResponse s = assertInstanceOf(IdempotencyResult.Replayed.class, run("acct-a", BODY, c -> good))
			.response();
		assertEquals("/p/1 \t2", s.headers().get("location"));
		assertEquals("caf\u00e9 \ud83d\ude00 \u20ac", TestDb.value(
			"SELECT response -> 'body' ->> 's' FROM idem_keys WHERE key = ?", key));
	}

	/** A completed record whose response is then rewritten by SQL, as any role with UPDATE can. */
	private void storedAs(String response) {
		run("acct-a", BODY, insert("acct-a", 201));
		TestDb.sql("UPDATE idem_keys SET response = ?::jsonb WHERE key = ?", response, key);
	}

	static final String TAMPERED = "{\"v\": 1, \"headers\": {\"content-type\": \"application/json\", "
		+ "\"location\": \"/p/1\", \"set-cookie\": \"a=b\", \"content-length\": \"99\", "
		+ "\"transfer-encoding\": \"chunked\", \"connection\": \"close\", \"x-internal\": \"s\"}, "
		+ "\"body\": {\"id\": 1}}";

	@Test
	void replayAppliesTheAllowListAndNeverFramingHeaders() {
		storedAs(TAMPERED);
		StoredResponse s = assertInstanceOf(IdempotencyResult.Replayed.class,
			run("acct-a", BODY, insert("acct-a", 201))).response();
		assertEquals(Map.of("content-type", "application/json", "location", "/p/1"), s.headers());
		assertEquals("{\"id\": 1}", new String(s.body(), StandardCharsets.UTF_8));
		// allow-listed, set-cookie is replayed; framing and hop-by-hop never
		engine = new IdempotencyEngine(IdempotencySettings.builder().replayHeaders("content-type", "set-cookie",
			"content-length", "transfer-encoding", "connection", "x-internal").build(),
			new JdbcTransactionRunner(TestDb.pool()));
		s = assertInstanceOf(IdempotencyResult.Replayed.class, run("acct-a", BODY, insert("acct-a", 201)))
			.response();
		assertEquals(Map.of("content-type", "application/json", "set-cookie", "a=b", "x-internal", "s"),
			s.headers());
		assertEquals(1, calls.get());
	}

	@org.junit.jupiter.params.ParameterizedTest
	@org.junit.jupiter.params.provider.ValueSource(strings = {
		"{\"v\": \"1\", \"body\": {}}",
		"{\"v\": 2, \"body\": {}}",
		"{\"v\": null, \"body\": {}}",
		"{\"v\": 1.5, \"body\": {}}",
		"{\"v\": 1, \"headers\": [], \"body\": {}}",
		"{\"v\": 1, \"headers\": \"content-type: text/plain\", \"body\": {}}",
		"{\"v\": 1, \"headers\": {\"location\": 5}, \"body\": {}}",
		"{\"v\": 1, \"headers\": {\"location\": \"/p/1\\r\\nSet-Cookie: a=b\"}, \"body\": {}}",
		"{\"v\": 1, \"headers\": {\"content-type\": \"text/plain; charset=\u20ac\"}, \"body\": {}}",
		"{\"v\": 1, \"headers\": {\"bad name\": \"x\"}, \"body\": {}}",
		"{\"v\": 1, \"body\": {}, \"body_base64\": \"AA==\"}",
		"{\"v\": 1, \"body_base64\": \"AA\"}",
		"{\"v\": 1, \"body_base64\": \"A!==\"}",
		"{\"v\": 1, \"body_base64\": 5}"})
	void unreadableRecordIs500UnsupportedEnvelope(String response) {
		storedAs(response);
		Problem p = problem(run("acct-a", BODY, insert("acct-a", 201)));
		assertEquals(500, p.status());
		assertEquals(ProblemCode.UNSUPPORTED_ENVELOPE, p.code());
		assertEquals(1, calls.get());
		assertEquals(1, effects());
	}

	@Test
	void versionOnePointZeroIsOne() {
		storedAs("{\"v\": 1.0, \"headers\": {\"content-type\": \"text/plain\"}, \"body_base64\": \"b2s=\"}");
		StoredResponse s = assertInstanceOf(IdempotencyResult.Replayed.class,
			run("acct-a", BODY, insert("acct-a", 201))).response();
		assertArrayEquals("ok".getBytes(StandardCharsets.UTF_8), s.body());
		assertEquals("text/plain", s.headers().get("content-type"));
	}

	@Test
	void databaseRefusingConnectionsIs503Unavailable() {
		com.zaxxer.hikari.HikariConfig c = new com.zaxxer.hikari.HikariConfig();
		// nothing listens on port 1
		c.setJdbcUrl("jdbc:postgresql://127.0.0.1:1/none?connectTimeout=1");
		c.setConnectionTimeout(250);
		c.setInitializationFailTimeout(-1);
		try (HikariDataSource none = new HikariDataSource(c)) {
			engine = new IdempotencyEngine(IdempotencySettings.defaults(), new JdbcTransactionRunner(none));
			Problem p = problem(run("acct-a", BODY, insert("acct-a", 201)));
			assertEquals(503, p.status());
			assertEquals(ProblemCode.UNAVAILABLE, p.code());
			assertEquals(1, p.retryAfter());
			assertEquals(0, calls.get());
		}
		org.postgresql.ds.PGSimpleDataSource plain = new org.postgresql.ds.PGSimpleDataSource();
		plain.setURL("jdbc:postgresql://127.0.0.1:1/none");
		engine = new IdempotencyEngine(IdempotencySettings.defaults(), new JdbcTransactionRunner(plain));
		assertEquals(ProblemCode.UNAVAILABLE, problem(run("acct-a", BODY, insert("acct-a", 201))).code());
	}

	@Test
	void noPooledConnectionInTimeIs503Unavailable() throws SQLException {
		com.zaxxer.hikari.HikariConfig config = new com.zaxxer.hikari.HikariConfig();
		config.setJdbcUrl(TestDb.URL);
		config.setMaximumPoolSize(1);
		config.setConnectionTimeout(250);
		try (HikariDataSource one = new HikariDataSource(config)) {
			engine = new IdempotencyEngine(IdempotencySettings.defaults(), new JdbcTransactionRunner(one));
			try (Connection held = one.getConnection()) {
				assertTrue(held.isValid(1));
				Problem p = problem(run("acct-a", BODY, insert("acct-a", 201)));
				assertEquals(503, p.status());
				assertEquals(ProblemCode.UNAVAILABLE, p.code());
				assertEquals(1, p.retryAfter());
			}
			assertEquals(0, calls.get());
		}
	}

	@Test
	void connectionLostBeforeCommitIs503UnavailableAndRolledBack() {
		Problem p = problem(run("acct-a", BODY, c -> {
			insert("acct-a", 201).handle(c);
			// the server ends this session, as a restart would
			try (PreparedStatement st = c.prepareStatement("SELECT pg_terminate_backend(pg_backend_pid())")) {
				st.execute();
			}
			return new CapturedResponse(201, Map.of(), null);
		}));
		assertEquals(503, p.status());
		assertEquals(ProblemCode.UNAVAILABLE, p.code());
		assertEquals(1, p.retryAfter());
		assertEquals(0, effects());
		assertEquals(0, records());
		// the retry runs again, on a connection that works
		assertTrue(assertInstanceOf(IdempotencyResult.Handled.class, run("acct-a", BODY, insert("acct-a", 201)))
			.completed());
		assertEquals(1, effects());
	}

	@Test
	void nulOrOverLongPrincipalIs400() {
		for (String scope : new String[] {"a\u0000b", "s".repeat(256)}) {
			Problem p = problem(run(scope, BODY, insert(scope, 201)));
			assertEquals(400, p.status(), scope.length() + " " + p.code());
			assertEquals(ProblemCode.INVALID_REQUEST, p.code());
		}
		assertEquals(0, calls.get());
		assertEquals(0, records());
	}

	@Test
	void handlerPastTheTimeLimitIsRolledBackAndFreesTheKeyAtTheLimit() throws InterruptedException {
		engine = new IdempotencyEngine(IdempotencySettings.builder().timeLimit(Duration.ofMillis(500)).build(),
			new JdbcTransactionRunner(TestDb.pool()));
		long[] recordsWhileHung = {-1};
		long start = System.nanoTime();
		// hung outside SQL: the key is freed at the limit, while the handler still runs
		Problem p = problem(run("acct-a", BODY, c -> {
			insert("acct-a", 201).handle(c);
			Thread.sleep(2000);
			recordsWhileHung[0] = records();
			return new CapturedResponse(201, Map.of(), null);
		}));
		assertEquals(503, p.status());
		assertEquals(ProblemCode.TIME_LIMIT, p.code());
		assertEquals(1, p.retryAfter());
		assertEquals(0, recordsWhileHung[0]);
		assertEquals(0, effects());
		assertEquals(0, records());
		// hung in SQL: answered at the limit
		start = System.nanoTime();
		p = problem(run("acct-a", BODY, c -> {
			insert("acct-a", 201).handle(c);
			try (PreparedStatement st = c.prepareStatement("SELECT pg_sleep(10)")) {
				st.execute();
			}
			return new CapturedResponse(201, Map.of(), null);
		}));
		assertEquals(ProblemCode.TIME_LIMIT, p.code());
		// its server session ends at once (the statement cancelled), not after pg_sleep's 10 s
		for (int i = 0; i < 50 && TestDb.count("SELECT count(*) FROM pg_stat_activity "
			+ "WHERE query = 'SELECT pg_sleep(10)'") > 0; i++)
			Thread.sleep(100);
		assertTrue(Duration.ofNanos(System.nanoTime() - start).toMillis() < 8000);
		assertEquals(0, records());
		// within the limit: completed, on a working connection
		assertTrue(assertInstanceOf(IdempotencyResult.Handled.class, run("acct-a", BODY, insert("acct-a", 201)))
			.completed());
		assertEquals(1, effects());
	}

	@Test
	void retryableStatusesAreASetting() {
		engine = new IdempotencyEngine(IdempotencySettings.builder().retryableStatuses(StatusSet.parse("402")).build(),
			new JdbcTransactionRunner(TestDb.pool()));
		run("acct-a", BODY, insert("acct-a", 402));
		assertEquals(0, records());
		run("acct-a", BODY, insert("acct-a", 503));
		assertEquals(1, records());
	}

	@Test
	void missingKeyIs400OrRunsWithoutIdempotency() {
		Problem p = problem(engine.execute(request(null, BODY), Route.named("create-payment"), () -> "acct-a",
			insert("acct-a", 201)));
		assertEquals(400, p.status());
		assertEquals(ProblemCode.MISSING_KEY, p.code());
		IdempotencyResult r = engine.execute(request(null, BODY), Route.named("create-payment").withKeyRequired(false),
			() -> "acct-a", c -> {
				calls.incrementAndGet();
				assertNull(c);
				return new CapturedResponse(200, Map.of(), null);
			});
		assertEquals(200, r.status());
		assertEquals(1, calls.get());
	}

	@Test
	void malformedKeyAndTwoFieldsAre400() {
		IdempotencyResult r = engine.execute(new IncomingRequest("POST", "/p", List.of("a", "b"), null, null),
			Route.defaults(), () -> "acct-a", insert("acct-a", 201));
		assertEquals(ProblemCode.INVALID_KEY, problem(r).code());
		assertEquals(400, r.status());
		r = engine.execute(request("\"bad\\n\"", BODY), Route.defaults(), () -> "acct-a", insert("acct-a", 201));
		assertEquals(ProblemCode.INVALID_KEY, problem(r).code());
		assertEquals(0, calls.get());
	}

	@Test
	void noPrincipalIs401() {
		for (String scope : new String[] {null, ""}) {
			Problem p = problem(run(scope, BODY, insert("acct-a", 201)));
			assertEquals(401, p.status());
			assertEquals(ProblemCode.UNAUTHENTICATED, p.code());
		}
		assertEquals(0, calls.get());
	}

	@Test
	void throwingScopeIs500() {
		Problem p = problem(engine.execute(request(key, BODY), Route.named("create-payment"), () -> {
			throw new IllegalStateException("the token service is down");
		}, insert("acct-a", 201)));
		assertEquals(500, p.status());
		assertEquals(ProblemCode.INTERNAL_ERROR, p.code());
		assertEquals(0, calls.get());
		assertEquals(0, records());
	}

	@Test
	void extensionsArgumentErrorIs400WithItsMessage() {
		key = "k".repeat(256);
		Problem p = problem(run("acct-a", BODY, insert("acct-a", 201)));
		assertEquals(400, p.status());
		assertEquals(ProblemCode.INVALID_REQUEST, p.code());
		assertTrue(p.detail().contains("argument \"key\""), p.detail());
		key = "chave-\u00e9";
		p = problem(run("acct-a", BODY, insert("acct-a", 201)));
		assertEquals("argument \"key\" contains a character outside printable ASCII", p.detail());
		assertEquals(0, calls.get());
	}

	@Test
	void subsetOnNonJsonBodyIs400() {
		IdempotencyResult r = engine.execute(new IncomingRequest("POST", "/p", List.of(key), "text/plain",
			"x".getBytes(StandardCharsets.UTF_8)), Route.defaults().withFingerprint("/a"), () -> "acct-a",
			insert("acct-a", 201));
		assertEquals(ProblemCode.INVALID_REQUEST, problem(r).code());
		assertEquals(400, r.status());
	}

	@Test
	void defaultOperationIsMethodAndPath() {
		engine.execute(request(key, BODY), Route.defaults(), () -> "acct-a", insert("acct-a", 201));
		assertEquals("POST /payments", TestDb.value("SELECT operation FROM idem_keys WHERE key = ?", key));
	}

	@Test
	void serializationFailureAndDeadlockAre503Retry() {
		for (String state : new String[] {"40001", "40P01"}) {
			Problem p = problem(run("acct-a", BODY, c -> {
				insert("acct-a", 201).handle(c);
				try (PreparedStatement st = c.prepareStatement(
					"DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '" + state + "'; END $$")) {
					st.execute();
				}
				return null;
			}));
			assertEquals(503, p.status());
			assertEquals(ProblemCode.RETRY, p.code());
			assertEquals(1, p.retryAfter());
		}
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void readOnlyIs503AndReplaysStillAnswer() {
		run("acct-a", BODY, insert("acct-a", 201));
		try (HikariDataSource ro = TestDb.pool(TestDb.URL, "SET default_transaction_read_only = on")) {
			IdempotencyEngine roEngine = new IdempotencyEngine(IdempotencySettings.defaults(), new JdbcTransactionRunner(ro));
			IdempotencyResult replay = roEngine.execute(request(key, BODY), Route.named("create-payment"),
				() -> "acct-a", insert("acct-a", 201));
			assertInstanceOf(IdempotencyResult.Replayed.class, replay);
			String fresh = key + "-new";
			Problem p = problem(roEngine.execute(request(fresh, BODY), Route.named("create-payment"),
				() -> "acct-a", insert("acct-a", 201)));
			assertEquals(503, p.status());
			assertEquals(ProblemCode.READ_ONLY, p.code());
			assertEquals(1, p.retryAfter());
			assertEquals(0, TestDb.count("SELECT count(*) FROM idem_keys WHERE key = ?", fresh));
		}
		assertEquals(1, effects());
	}

	@Test
	void higherEnvelopeVersionIs500() {
		TestDb.sql("SELECT outcome FROM idem_reserve('create-payment', ?, ?::jsonb, scope => 'acct-a')", key,
			RequestDocument.build("POST", "/payments", "application/json", BODY.getBytes(StandardCharsets.UTF_8), List.of()));
		TestDb.sql("SELECT idem_complete('create-payment', ?, '{\"v\": 2, \"body\": {}}', 201, scope => 'acct-a')", key);
		Problem p = problem(run("acct-a", BODY, insert("acct-a", 201)));
		assertEquals(500, p.status());
		assertEquals(ProblemCode.UNSUPPORTED_ENVELOPE, p.code());
	}

	@Test
	void recordCompletedByPlainSqlReplaysAsJson() {
		TestDb.sql("SELECT outcome FROM idem_reserve('create-payment', ?, ?::jsonb, scope => 'acct-a')", key,
			RequestDocument.build("POST", "/payments", "application/json", BODY.getBytes(StandardCharsets.UTF_8), List.of()));
		TestDb.sql("SELECT idem_complete('create-payment', ?, '{\"id\": \"pay_1\"}', 201, scope => 'acct-a')", key);
		StoredResponse s = assertInstanceOf(IdempotencyResult.Replayed.class,
			run("acct-a", BODY, insert("acct-a", 201))).response();
		assertEquals("application/json", s.headers().get("content-type"));
		assertArrayEquals("{\"id\": \"pay_1\"}".getBytes(StandardCharsets.UTF_8), s.body());
	}

	@Test
	void mappingAndRetryAfterAreData() {
		engine = new IdempotencyEngine(IdempotencySettings.builder()
			.mapping(ProblemMapping.defaults().toBuilder().entry(ProblemCode.MISMATCH, 409, true).build())
			.retryAfterSeconds(7).build(), new JdbcTransactionRunner(TestDb.pool()));
		run("acct-a", BODY, insert("acct-a", 201));
		Problem p = problem(run("acct-a", "{\"amount\": 5}", insert("acct-a", 201)));
		assertEquals(409, p.status());
		assertEquals(7, p.retryAfter());
		assertEquals("7", p.headers().get("retry-after"));
		assertEquals("application/problem+json", p.headers().get("content-type"));
	}

	@Test
	void ttlIsPassedToTheReservation() {
		engine.execute(request(key, BODY), Route.named("create-payment").withTtl(Duration.ofMinutes(90)),
			() -> "acct-a", insert("acct-a", 201));
		assertEquals("01:30:00", TestDb.value("SELECT (expires_at - updated_at)::text FROM idem_keys WHERE key = ?", key));
	}

	@Test
	void versionCheck() throws SQLException {
		assertTrue(VersionCheck.compare(VersionCheck.require(TestDb.pool()), "0.2.0") >= 0);
		try (HikariDataSource none = TestDb.pool(TestDb.sibling("_noext"), null)) {
			IllegalStateException e = assertThrows(IllegalStateException.class, () -> VersionCheck.require(none));
			assertTrue(e.getMessage().contains("not installed"), e.getMessage());
		}
		try (HikariDataSource old = TestDb.pool(TestDb.sibling("_old"), null)) {
			IllegalStateException e = assertThrows(IllegalStateException.class, () -> VersionCheck.require(old));
			assertTrue(e.getMessage().contains("version 0.1.0"), e.getMessage());
		}
		assertTrue(VersionCheck.compare("0.10.0", "0.9.1") > 0);
		assertEquals(0, VersionCheck.compare("0.2", "0.2.0"));
	}
}
