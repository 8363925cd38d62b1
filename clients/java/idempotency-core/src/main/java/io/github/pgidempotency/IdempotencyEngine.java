package io.github.pgidempotency;

import java.lang.System.Logger.Level;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.Optional;

import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

/**
 * One idempotent HTTP request, as doc/clients.md says: the key parsed, the
 * scope asked for, the fingerprint document built, then, through the one
 * core runner ({@link KeyRunner}), in one transaction
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

	private final IdempotencySettings settings;
	private final KeyRunner keys;
	private final KeyRunner.Policy policy;

	/**
	 * An engine.
	 *
	 * @param settings the settings
	 * @param runner the transactions
	 */
	public IdempotencyEngine(IdempotencySettings settings, TransactionRunner runner) {
		this.settings = java.util.Objects.requireNonNull(settings);
		this.keys = new KeyRunner(runner);
		this.policy = new KeyRunner.Policy(status -> settings.retryableStatuses().contains(status),
			settings::isFinalError, settings.timeLimit());
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
			KeyRunner.Result result = keys.run(new KeyRunner.Call(operation, key.get(), principal, document, ttl),
				policy, c -> {
					try {
						return new HttpCompletion(handler.handle(c));
					} catch (RaisedError e) {
						throw new KeyRunner.Raised(e.getCause(), new HttpCompletion(e.resolved()));
					}
				});
			if (result instanceof KeyRunner.Replay r)
				return new IdempotencyResult.Replayed(ResponseEnvelope.decode(r.status(), r.response(), r.body(),
					settings.replayHeaders()));
			KeyRunner.New n = (KeyRunner.New) result;
			return new IdempotencyResult.Handled(((HttpCompletion) n.completion()).response, n.completed());
		} catch (Exception e) {
			return refuse(e);
		}
	}

	/**
	 * A handler's response as the runner's completion: checked (only what can
	 * be sent is committed) and encoded as the envelope only when completed.
	 */
	private final class HttpCompletion implements KeyRunner.Completion {
		final CapturedResponse response;

		HttpCompletion(CapturedResponse response) {
			this.response = response;
		}

		@Override
		public int status() {
			return response.status();
		}

		@Override
		public String response() {
			SendableResponse.check(response);
			String envelope = ResponseEnvelope.encode(response, settings.replayHeaders());
			// ASCII: a character is a byte
			if (envelope.length() > settings.maxStoredResponse())
				throw new UnsendableResponseException("the response is " + envelope.length()
					+ " bytes stored, over the limit of " + settings.maxStoredResponse());
			return envelope;
		}
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
		// a pool that has no connection in time (HikariCP's, without a state of its own)
		if (code == ProblemCode.INTERNAL_ERROR && sql instanceof java.sql.SQLTransientConnectionException)
			code = ProblemCode.UNAVAILABLE;
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
}
