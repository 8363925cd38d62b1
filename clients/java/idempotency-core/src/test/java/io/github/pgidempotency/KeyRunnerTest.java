package io.github.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.PreparedStatement;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The one core runner, called with plain functions (no web framework), against the real extension. */
class KeyRunnerTest {
	private static final String REQUEST = "{\"order\": 7}";

	private final KeyRunner runner = new KeyRunner(new JdbcTransactionRunner(TestDb.pool()));
	private final AtomicInteger calls = new AtomicInteger();
	private String key;

	@BeforeAll
	static void schema() {
		TestDb.sql("CREATE TABLE IF NOT EXISTS runner_effects (id bigserial PRIMARY KEY, k text NOT NULL)");
	}

	@BeforeEach
	void setUp() {
		key = "k-" + UUID.randomUUID();
	}

	private KeyRunner.Call call(String request) {
		return new KeyRunner.Call("charge", key, "billing", request, null);
	}

	/** Inserts one effect on the transaction's connection, and answers a status. */
	private KeyRunner.Work charge(int status) {
		return c -> {
			calls.incrementAndGet();
			try (PreparedStatement st = c.prepareStatement("INSERT INTO runner_effects (k) VALUES (?)")) {
				st.setString(1, key);
				st.execute();
			}
			return KeyRunner.Completion.of(status, "{\"charged\": true}");
		};
	}

	private long effects() {
		return TestDb.count("SELECT count(*) FROM runner_effects WHERE k = ?", key);
	}

	private long records() {
		return TestDb.count("SELECT count(*) FROM idem_keys WHERE key = ?", key);
	}

	@Test
	void newThenReplay() throws Exception {
		KeyRunner.New n = assertInstanceOf(KeyRunner.New.class, runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT,
			charge(200)));
		assertTrue(n.completed());
		assertEquals(200, n.completion().status());
		assertEquals("completed:200", TestDb.value(
			"SELECT status || ':' || response_status FROM idem_keys WHERE key = ? AND operation = 'charge' "
				+ "AND scope = 'billing'", key));
		KeyRunner.Replay r = assertInstanceOf(KeyRunner.Replay.class,
			runner.run(call("{\"order\":7.0}"), KeyRunner.Policy.DEFAULT, charge(200)));
		assertEquals(200, r.status());
		assertEquals("{\"charged\": true}", r.response());
		assertEquals(1, calls.get());
		assertEquals(1, effects());
	}

	@Test
	void mismatchIsTyped() throws Exception {
		runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, charge(200));
		assertThrows(KeyMismatchException.class,
			() -> runner.run(call("{\"order\": 8}"), KeyRunner.Policy.DEFAULT, charge(200)));
		assertEquals(1, calls.get());
		assertEquals(1, effects());
	}

	@Test
	void inProgressWithTwoConcurrentCalls() throws Exception {
		CountDownLatch inside = new CountDownLatch(1);
		CountDownLatch release = new CountDownLatch(1);
		CompletableFuture<KeyRunner.Result> first = CompletableFuture.supplyAsync(() -> {
			try {
				return runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, c -> {
					KeyRunner.Completion done = charge(200).run(c);
					inside.countDown();
					assertTrue(release.await(30, TimeUnit.SECONDS));
					return done;
				});
			} catch (Exception e) {
				throw new RuntimeException(e);
			}
		});
		assertTrue(inside.await(30, TimeUnit.SECONDS));
		// the first holds the key in its open transaction
		assertThrows(KeyInProgressException.class,
			() -> runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, charge(200)));
		release.countDown();
		assertTrue(assertInstanceOf(KeyRunner.New.class, first.get(30, TimeUnit.SECONDS)).completed());
		assertEquals(1, calls.get());
		assertEquals(1, effects());
		assertEquals(1, records());
	}

	@Test
	void stuckIsTyped() {
		TestDb.sql("SELECT outcome FROM idem_reserve('charge', ?, ?::jsonb, scope => 'billing')", key, REQUEST);
		TestDb.sql("UPDATE idem_keys SET updated_at = updated_at - interval '1 day' WHERE key = ?", key);
		assertThrows(KeyStuckException.class, () -> runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, charge(200)));
		assertEquals(0, calls.get());
	}

	@Test
	void aRaiseRollsBackAndIsRaisedAgain() throws Exception {
		IllegalStateException boom = new IllegalStateException("down");
		IllegalStateException thrown = assertThrows(IllegalStateException.class,
			() -> runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, c -> {
				charge(200).run(c);
				throw boom;
			}));
		assertSame(boom, thrown);
		assertEquals(0, effects());
		assertEquals(0, records());
		// the retry runs again
		assertTrue(assertInstanceOf(KeyRunner.New.class,
			runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, charge(200))).completed());
		assertEquals(2, calls.get());
	}

	@Test
	void retryableStatusRollsBack() throws Exception {
		KeyRunner.Policy policy = new KeyRunner.Policy(status -> status >= 500, e -> false);
		KeyRunner.New n = assertInstanceOf(KeyRunner.New.class, runner.run(call(REQUEST), policy, charge(503)));
		assertFalse(n.completed());
		assertEquals(0, effects());
		assertEquals(0, records());
	}

	@Test
	void raisedWithAnAnswerRollsBackUnlessFinal() throws Exception {
		KeyRunner.Work declined = c -> {
			KeyRunner.Completion answer = charge(402).run(c);
			throw new KeyRunner.Raised(new IllegalArgumentException("declined"), answer);
		};
		KeyRunner.New n = assertInstanceOf(KeyRunner.New.class,
			runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, declined));
		assertFalse(n.completed());
		assertEquals(402, n.completion().status());
		assertEquals(0, records());
		KeyRunner.Policy finalDeclines = new KeyRunner.Policy(status -> false,
			e -> e instanceof IllegalArgumentException);
		assertTrue(assertInstanceOf(KeyRunner.New.class, runner.run(call(REQUEST), finalDeclines, declined))
			.completed());
		assertInstanceOf(KeyRunner.Replay.class, runner.run(call(REQUEST), finalDeclines, declined));
		assertEquals(2, calls.get());
		assertEquals(1, effects());
	}

	@Test
	void aCompletionThatCannotBeStoredRollsBack() {
		KeyRunner.Work bad = c -> {
			charge(200).run(c);
			return new KeyRunner.Completion() {
				@Override
				public int status() {
					return 200;
				}

				@Override
				public String response() {
					throw new UnsendableResponseException("no");
				}
			};
		};
		assertThrows(UnsendableResponseException.class, () -> runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT, bad));
		// JSON the server cannot store
		assertThrows(UnsendableResponseException.class, () -> runner.run(call(REQUEST), KeyRunner.Policy.DEFAULT,
			c -> KeyRunner.Completion.of(200, "{\"a\": \"\\u0000\"}")));
		assertEquals(0, effects());
		assertEquals(0, records());
	}
}
