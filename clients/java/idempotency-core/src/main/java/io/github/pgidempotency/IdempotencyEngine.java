package io.github.pgidempotency;

import java.lang.System.Logger.Level;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.util.Optional;

import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

/**
 * One idempotent request, as doc/clients.md says: the key parsed, the scope
 * asked for, the fingerprint document built, then in one transaction
 * {@code idem_reserve}, the handler (on the same connection), {@code
 * idem_complete} and COMMIT; a handler error or a retryable status rolls
 * back. A {@link RaisedError} (an error the framework resolved to a
 * response) rolls back too and answers that response, unless the settings
 * mark it {@linkplain IdempotencySettings#isFinalError final}: then it is
 * completed like a returned response. Thread-safe; one engine serves every
 * request.
 *
 * <pre>{@code
 * IdempotencyEngine engine = new IdempotencyEngine(IdempotencySettings.defaults(),
 *     new JdbcTransactionRunner(dataSource));
 * IdempotencyResult result = engine.execute(request, Route.named("create-payment"),
 *     () -> currentAccount(), connection -> createPayment(connection, request));
 * }</pre>
 */
public final class IdempotencyEngine {
	private static final System.Logger LOG = System.getLogger(IdempotencyEngine.class.getName());

	static final String RESERVE = "SELECT r.outcome, r.response_status, r.response::text, (r.response -> 'body')::text "
		+ "FROM idem_reserve(?, ?, ?::jsonb, scope => ?, ttl => ?::interval) AS r";
	static final String COMPLETE = "SELECT idem_complete(?, ?, ?::jsonb, ?, scope => ?)";

	/** SQLSTATE in_failed_sql_transaction: an earlier statement's error aborted it */
	private static final String IN_FAILED_TRANSACTION = "25P02";

	private final IdempotencySettings settings;
	private final TransactionRunner runner;

	/**
	 * An engine.
	 *
	 * @param settings the settings
	 * @param runner the transactions
	 */
	public IdempotencyEngine(IdempotencySettings settings, TransactionRunner runner) {
		this.settings = java.util.Objects.requireNonNull(settings);
		this.runner = java.util.Objects.requireNonNull(runner);
	}

	/** @return the settings */
	public IdempotencySettings settings() {
		return settings;
	}

	/**
	 * The principal of a request, for the scope.
	 */
	@FunctionalInterface
	public interface Scope {
		/**
		 * The principal.
		 *
		 * @return a user id, an account, an API client; {@code null} or empty
		 *         where the request has none (401 {@code unauthenticated})
		 * @throws Exception where it cannot be found (500)
		 */
		String get() throws Exception;
	}

	/**
	 * The application's handler.
	 */
	@FunctionalInterface
	public interface Handler {
		/**
		 * Handles the request.
		 *
		 * @param connection the connection of the key's transaction, on which
		 *        the handler's own SQL runs; {@code null} where the route's key
		 *        is optional and the request has none (no transaction)
		 * @return the response
		 * @throws RaisedError where the handler raised an error that its
		 *         framework resolved to a response: rolled back and that
		 *         response answered, or completed with it where the error is final
		 * @throws Exception any other: rolled back (the client gets 500
		 *         {@code internal-error}, or the mapping's answer for the
		 *         SQLSTATE it carries)
		 */
		CapturedResponse handle(Connection connection) throws Exception;
	}

	/**
	 * Does one request.
	 *
	 * @param request the request
	 * @param route the route's settings
	 * @param scope the principal
	 * @param handler the handler, called at most once
	 * @return what to answer, once the transaction has ended
	 */
	public IdempotencyResult execute(IncomingRequest request, Route route, Scope scope, Handler handler) {
		try {
			Optional<String> key = IdempotencyKeys.parse(request.keyFields());
			boolean keyRequired = route.keyRequired() != null ? route.keyRequired() : settings.keyRequired();
			if (key.isEmpty()) {
				if (keyRequired)
					throw new IdempotencyException(ProblemCode.MISSING_KEY);
				try {
					return new IdempotencyResult.Handled(handler.handle(null), false);
				} catch (RaisedError e) {
					return new IdempotencyResult.Handled(e.resolved(), false);
				}
			}
			String principal = scope.get();
			if (principal == null || principal.isEmpty())
				throw new IdempotencyException(ProblemCode.UNAUTHENTICATED);
			String operation = route.operation() != null ? route.operation()
				: request.method().toUpperCase(java.util.Locale.ROOT) + " " + request.path();
			String document = RequestDocument.build(request.method(), request.path(), request.contentType(),
				request.body(), route.fingerprint());
			Duration ttl = route.ttl() != null ? route.ttl() : settings.ttl();
			return runner.inTransaction((c, control) -> run(c, control, operation, key.get(), principal,
				document, ttl, handler));
		} catch (Exception e) {
			return refuse(e);
		}
	}

	/** The transaction's work: reserve, then handle and complete, or answer. */
	private IdempotencyResult run(Connection c, TransactionRunner.Control control, String operation, String key,
		String scope, String document, Duration ttl, Handler handler) throws Exception {
		String outcome;
		int status;
		String response;
		String body;
		try (PreparedStatement st = c.prepareStatement(RESERVE)) {
			st.setString(1, operation);
			st.setString(2, key);
			st.setString(3, document);
			st.setString(4, scope);
			if (ttl == null)
				st.setNull(5, Types.VARCHAR);
			else
				st.setString(5, interval(ttl));
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
				return new IdempotencyResult.Replayed(ResponseEnvelope.decode(status, response, body,
					settings.replayHeaders()));
			case "in_progress":
				control.setRollbackOnly();
				return problem(ProblemCode.IN_PROGRESS, null, null);
			case "stuck":
				control.setRollbackOnly();
				return problem(ProblemCode.STUCK, null, null);
			case "mismatch":
				control.setRollbackOnly();
				return problem(ProblemCode.MISMATCH, null, null);
			default:
				throw new IllegalStateException("idem_reserve returned the unknown outcome \"" + outcome + "\"");
		}

		CapturedResponse answer;
		boolean raised = false;
		try {
			answer = handler.handle(c);
		} catch (RaisedError e) {
			// rolled back whatever status it was resolved to, unless final;
			// a final one whose transaction can no longer commit too
			answer = e.resolved();
			raised = true;
			if (!settings.isFinalError(e.getCause()) || control.isRollbackOnly()) {
				control.setRollbackOnly();
				return new IdempotencyResult.Handled(answer, false);
			}
		}
		if (settings.retryableStatuses().contains(answer.status())) {
			control.setRollbackOnly();
			return new IdempotencyResult.Handled(answer, false);
		}
		// only what can be sent is committed (thrown: rolled back, 500)
		SendableResponse.check(answer);
		String envelope = ResponseEnvelope.encode(answer, settings.replayHeaders());
		try (PreparedStatement st = c.prepareStatement(COMPLETE)) {
			st.setString(1, operation);
			st.setString(2, key);
			st.setString(3, envelope);
			st.setInt(4, answer.status());
			st.setString(5, scope);
			st.execute();
		} catch (SQLException e) {
			// a final error raised from SQL that aborted the transaction
			if (raised && IN_FAILED_TRANSACTION.equals(e.getSQLState())) {
				control.setRollbackOnly();
				return new IdempotencyResult.Handled(answer, false);
			}
			// the server could not read the envelope: the handler's answer,
			// not the request, is at fault (500, not 400 invalid-request)
			if (e.getSQLState() != null && e.getSQLState().startsWith("22")) {
				UnsendableResponseException u = new UnsendableResponseException(
					"the server could not store the response: SQLSTATE " + e.getSQLState());
				u.addSuppressed(e);
				throw u;
			}
			throw e;
		}
		return new IdempotencyResult.Handled(answer, true);
	}

	/** The answer for a failure: the mapping's row for its case. */
	private IdempotencyResult refuse(Exception e) {
		if (e instanceof IdempotencyException ie)
			return problem(ie.code(), ie.getMessage(), e);
		if (e instanceof UnsendableResponseException) {
			LOG.log(Level.ERROR, "idempotent request rolled back: its response cannot be sent or stored", e);
			return problem(ProblemCode.INTERNAL_ERROR, null, e);
		}
		SQLException sql = sqlException(e);
		ProblemCode code = settings.mapping().forSqlState(sql == null ? null : sql.getSQLState());
		String detail = null;
		if (code == ProblemCode.INVALID_REQUEST)
			detail = serverMessage(sql);
		if (code == ProblemCode.INTERNAL_ERROR)
			LOG.log(Level.ERROR, "idempotent request failed and was rolled back", e);
		else
			LOG.log(Level.DEBUG, "idempotent request refused as " + code.code(), e);
		return problem(code, detail, e);
	}

	private IdempotencyResult.Refused problem(ProblemCode code, String detail, Throwable cause) {
		return new IdempotencyResult.Refused(settings.mapping().problem(code, detail, settings.retryAfterSeconds()),
			cause);
	}

	/** The first SQLException in a chain of causes (a framework may wrap it). */
	static SQLException sqlException(Throwable t) {
		for (int depth = 0; t != null && depth < 32; depth++, t = t.getCause())
			if (t instanceof SQLException s)
				return s;
		return null;
	}

	/** The server's primary message, without the "ERROR:" prefix and position. */
	private static String serverMessage(SQLException e) {
		if (e instanceof PSQLException p) {
			ServerErrorMessage m = p.getServerErrorMessage();
			if (m != null && m.getMessage() != null)
				return m.getMessage();
		}
		return e.getMessage();
	}

	/** A ttl as PostgreSQL interval input. */
	static String interval(Duration ttl) {
		return ttl.getSeconds() + "." + String.format("%09d", ttl.getNano()) + " seconds";
	}
}
