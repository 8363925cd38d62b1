package io.github.pgidempotency;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.util.Objects;
import java.util.function.IntPredicate;
import java.util.function.Predicate;

/**
 * The one core runner (doc/clients.md, "One core: run a function under a
 * key"): the only code that reserves, runs, completes or rolls back, and
 * commits. In one transaction it calls {@code idem_reserve} with the request
 * document, and on {@code new} runs the function with the open transaction's
 * connection, then completes its {@link Completion} with {@code
 * idem_complete} and commits. The HTTP middleware ({@link IdempotencyEngine})
 * is a caller of it; so are other kinds of work (a message, a job).
 *
 * <pre>{@code
 * KeyRunner runner = new KeyRunner(new JdbcTransactionRunner(dataSource));
 * KeyRunner.Result r = runner.run(
 *     new KeyRunner.Call("charge", messageId, "billing", "{\"order\": 7}", null),
 *     KeyRunner.Policy.DEFAULT,
 *     connection -> KeyRunner.Completion.of(200, "{\"charged\": true}"));
 * }</pre>
 */
public final class KeyRunner {
	private final TransactionRunner transactions;

	/**
	 * A runner.
	 *
	 * @param transactions where connections and transactions come from
	 */
	public KeyRunner(TransactionRunner transactions) {
		this.transactions = Objects.requireNonNull(transactions);
	}

	/**
	 * What to run under: the arguments of {@code idem_reserve}.
	 *
	 * @param operation the operation
	 * @param key the key
	 * @param scope the scope (the principal)
	 * @param request the request document, JSON text (its {@code idem_hash} is the fingerprint)
	 * @param ttl how long a completed record replays, or {@code null} for the server's default
	 */
	public record Call(String operation, String key, String scope, String request, Duration ttl) {
		/**
		 * Checks the required parts.
		 *
		 * @param operation the operation
		 * @param key the key
		 * @param scope the scope
		 * @param request the request document
		 * @param ttl the ttl, or {@code null}
		 */
		public Call {
			Objects.requireNonNull(operation, "operation");
			Objects.requireNonNull(key, "key");
			Objects.requireNonNull(scope, "scope");
			Objects.requireNonNull(request, "request");
		}
	}

	/**
	 * What the function answers: a status and the JSON response to store.
	 * {@link #response()} is asked for only where the completion is
	 * completed, inside the transaction and before {@code idem_complete}:
	 * it is where a caller checks what it can send, and throws to roll back.
	 */
	public interface Completion {
		/** @return the status ({@code response_status}) */
		int status();

		/**
		 * The JSON response to store ({@code idem_keys.response}).
		 *
		 * @return JSON text
		 */
		String response();

		/**
		 * A completion of a status and a JSON text.
		 *
		 * @param status the status
		 * @param response JSON text
		 * @return the completion
		 */
		static Completion of(int status, String response) {
			Objects.requireNonNull(response);
			return new Completion() {
				@Override
				public int status() {
					return status;
				}

				@Override
				public String response() {
					return response;
				}
			};
		}
	}

	/**
	 * Which completions roll back, which raised errors complete, and how long
	 * the key's transaction may run.
	 *
	 * @param retryable statuses whose completion is rolled back instead of completed
	 * @param finalError raised errors ({@link Raised}'s cause) completed instead of rolled back
	 * @param timeLimit how long the transaction may run before the runner ends
	 *        its connection (the server rolls back and frees the key) and
	 *        raises {@link KeyTimeLimitException}; {@code null} for no limit
	 */
	public record Policy(IntPredicate retryable, Predicate<Throwable> finalError, Duration timeLimit) {
		/** Nothing retryable, no error final, no time limit. */
		public static final Policy DEFAULT = new Policy(status -> false, error -> false);

		/**
		 * Checks the parts.
		 *
		 * @param retryable the retryable statuses
		 * @param finalError the final errors
		 * @param timeLimit the time limit, or {@code null}
		 */
		public Policy {
			Objects.requireNonNull(retryable);
			Objects.requireNonNull(finalError);
			if (timeLimit != null && (timeLimit.isNegative() || timeLimit.isZero()))
				throw new IllegalArgumentException("a time limit must be positive, not " + timeLimit);
		}

		/**
		 * A policy without a time limit.
		 *
		 * @param retryable the retryable statuses
		 * @param finalError the final errors
		 */
		public Policy(IntPredicate retryable, Predicate<Throwable> finalError) {
			this(retryable, finalError, null);
		}
	}

	/** The function, run in the key's transaction. */
	@FunctionalInterface
	public interface Work {
		/**
		 * Runs.
		 *
		 * @param connection the open transaction's connection (neither commit nor close it)
		 * @return the completion
		 * @throws Raised where it failed with an answer of its own: rolled back,
		 *         or completed with that answer where the policy's final errors take the cause
		 * @throws Exception anything else: rolled back and raised again
		 */
		Completion run(Connection connection) throws Exception;
	}

	/**
	 * The function raised an error that has an answer (an HTTP framework's
	 * resolved response).
	 */
	public static final class Raised extends Exception {
		private static final long serialVersionUID = 1L;

		/** The answer: not serialized with the error. */
		private final transient Completion resolved;

		/**
		 * An error and its answer.
		 *
		 * @param cause what was raised
		 * @param resolved its answer
		 */
		public Raised(Throwable cause, Completion resolved) {
			super("raised " + Objects.requireNonNull(cause).getClass().getName(), cause, false, false);
			this.resolved = Objects.requireNonNull(resolved);
		}

		/** @return the answer */
		public Completion resolved() {
			return resolved;
		}
	}

	/** What happened, once the transaction has ended. */
	public sealed interface Result {
	}

	/**
	 * {@code new}: the function ran.
	 *
	 * @param completion its completion (or a raised error's answer)
	 * @param completed whether it was completed and committed (false: rolled
	 *        back, for a retryable status or a raised error)
	 */
	public record New(Completion completion, boolean completed) implements Result {
	}

	/**
	 * {@code replay}: the stored answer; the function was not called.
	 *
	 * @param status the stored {@code response_status}
	 * @param response the stored {@code response} as text, or {@code null}
	 * @param body {@code response -> 'body'} as text, or {@code null}
	 */
	public record Replay(int status, String response, String body) implements Result {
	}

	static final String RESERVE = "SELECT r.outcome, r.response_status, r.response::text, (r.response -> 'body')::text "
		+ "FROM idem_reserve(?, ?, ?::jsonb, scope => ?, ttl => ?::interval) AS r";
	static final String COMPLETE = "SELECT idem_complete(?, ?, ?::jsonb, ?, scope => ?)";

	/** SQLSTATE in_failed_sql_transaction: an earlier statement's error aborted it */
	private static final String IN_FAILED_TRANSACTION = "25P02";

	/**
	 * Runs a function under a key.
	 *
	 * @param call the reservation's arguments
	 * @param policy retryable statuses and final errors
	 * @param work the function, called at most once
	 * @return {@link New} after COMMIT (or ROLLBACK), or {@link Replay}
	 * @throws KeyInProgressException another transaction holds the key
	 * @throws KeyStuckException its first attempt's outcome is unknown
	 * @throws KeyMismatchException the key was used with another request
	 * @throws Exception any other error, after ROLLBACK, as it was raised
	 */
	public Result run(Call call, Policy policy, Work work) throws Exception {
		Deadline deadline = new Deadline();
		try {
			return transactions.inTransaction((c, control) -> {
				deadline.arm(c, policy.timeLimit());
				Result r = inTransaction(c, control, call, policy, work);
				// no abort once the runner commits and the pool has the connection back
				if (!deadline.disarm())
					throw new KeyTimeLimitException();
				return r;
			});
		} catch (Exception e) {
			if (deadline.disarm() || e instanceof KeyTimeLimitException)
				throw e;
			KeyTimeLimitException t = new KeyTimeLimitException();
			t.addSuppressed(e);
			throw t;
		}
	}

	/** The time limit of one transaction: its connection aborted when it passes. */
	private static final class Deadline {
		private static final int IDLE = 0;
		private static final int ARMED = 1;
		private static final int FIRED = 2;
		private static final int DONE = 3;

		private final java.util.concurrent.atomic.AtomicInteger state =
			new java.util.concurrent.atomic.AtomicInteger(IDLE);
		private java.util.concurrent.ScheduledFuture<?> timer;

		void arm(Connection c, Duration limit) {
			if (limit == null)
				return;
			state.set(ARMED);
			timer = TIMER.schedule(() -> {
				if (state.compareAndSet(ARMED, FIRED)) {
					try {
						// a statement running on the server first (it would not see the
						// socket close until it ends), then the socket: the server
						// rolls back and frees the key
						if (c.isWrapperFor(org.postgresql.core.BaseConnection.class))
							c.unwrap(org.postgresql.core.BaseConnection.class).cancelQuery();
					} catch (SQLException | RuntimeException e) {
						LOG.log(System.Logger.Level.WARNING, "could not cancel a statement past its time limit", e);
					}
					try {
						c.abort(Runnable::run);
					} catch (SQLException | RuntimeException e) {
						LOG.log(System.Logger.Level.WARNING, "could not abort a transaction past its time limit", e);
					}
				}
			}, limit.toNanos(), java.util.concurrent.TimeUnit.NANOSECONDS);
		}

		/** @return false where the limit passed (the connection was aborted) */
		boolean disarm() {
			if (state.get() == FIRED)
				return false;
			if (state.compareAndSet(ARMED, DONE))
				timer.cancel(false);
			return state.get() != FIRED;
		}
	}

	private static final System.Logger LOG = System.getLogger(KeyRunner.class.getName());

	/** The timer of every runner's time limits: one daemon thread. */
	private static final java.util.concurrent.ScheduledThreadPoolExecutor TIMER = timer();

	private static java.util.concurrent.ScheduledThreadPoolExecutor timer() {
		java.util.concurrent.ScheduledThreadPoolExecutor t = new java.util.concurrent.ScheduledThreadPoolExecutor(1,
			r -> {
				Thread th = new Thread(r, "idempotency-time-limit");
				th.setDaemon(true);
				return th;
			});
		t.setRemoveOnCancelPolicy(true);
		return t;
	}

	private Result inTransaction(Connection c, TransactionRunner.Control control, Call call,
		Policy policy, Work work) throws Exception {
		String outcome;
		int status;
		String response;
		String body;
		try (PreparedStatement st = c.prepareStatement(RESERVE)) {
			st.setString(1, call.operation());
			st.setString(2, call.key());
			st.setString(3, call.request());
			st.setString(4, call.scope());
			if (call.ttl() == null)
				st.setNull(5, Types.VARCHAR);
			else
				st.setString(5, interval(call.ttl()));
			try (ResultSet rs = st.executeQuery()) {
				rs.next();
				outcome = rs.getString(1);
				status = rs.getInt(2);
				response = rs.getString(3);
				body = rs.getString(4);
			}
		}
		switch (outcome) {
			case "new":
				break;
			case "replay":
				control.setRollbackOnly();
				return new Replay(status, response, body);
			case "in_progress":
				throw new KeyInProgressException();
			case "stuck":
				throw new KeyStuckException();
			case "mismatch":
				throw new KeyMismatchException();
			default:
				throw new IllegalStateException("idem_reserve returned the unknown outcome \"" + outcome + "\"");
		}

		Completion answer;
		boolean raised = false;
		try {
			answer = work.run(c);
		} catch (Raised e) {
			// rolled back whatever its answer, unless final; a final one whose
			// transaction can no longer commit too
			answer = e.resolved();
			raised = true;
			if (!policy.finalError().test(e.getCause()) || control.isRollbackOnly()) {
				control.setRollbackOnly();
				return new New(answer, false);
			}
		}
		if (policy.retryable().test(answer.status())) {
			control.setRollbackOnly();
			return new New(answer, false);
		}
		String stored = answer.response();
		try (PreparedStatement st = c.prepareStatement(COMPLETE)) {
			st.setString(1, call.operation());
			st.setString(2, call.key());
			st.setString(3, stored);
			st.setInt(4, answer.status());
			st.setString(5, call.scope());
			st.execute();
		} catch (SQLException e) {
			// a final error raised from SQL that aborted the transaction
			if (raised && IN_FAILED_TRANSACTION.equals(e.getSQLState())) {
				control.setRollbackOnly();
				return new New(answer, false);
			}
			// the server could not read the response: the answer's fault, not the request's
			if (e.getSQLState() != null && e.getSQLState().startsWith("22")) {
				UnsendableResponseException u = new UnsendableResponseException(
					"the server could not store the response: SQLSTATE " + e.getSQLState());
				u.addSuppressed(e);
				throw u;
			}
			throw e;
		}
		return new New(answer, true);
	}

	/** A ttl as PostgreSQL interval input. */
	static String interval(Duration ttl) {
		return ttl.getSeconds() + "." + String.format("%09d", ttl.getNano()) + " seconds";
	}
}
