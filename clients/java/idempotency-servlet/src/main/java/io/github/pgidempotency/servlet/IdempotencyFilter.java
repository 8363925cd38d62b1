package io.github.pgidempotency.servlet;

import java.io.IOException;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.Collections;
import java.util.Map;
import java.util.Objects;

import javax.sql.DataSource;

import io.github.pgidempotency.IdempotencyEngine;
import io.github.pgidempotency.IdempotencyKeys;
import io.github.pgidempotency.IdempotencyResult;
import io.github.pgidempotency.IdempotencySettings;
import io.github.pgidempotency.IncomingRequest;
import io.github.pgidempotency.JdbcTransactionRunner;
import io.github.pgidempotency.Problem;
import io.github.pgidempotency.ProblemCode;
import io.github.pgidempotency.RaisedError;
import io.github.pgidempotency.Route;
import io.github.pgidempotency.StoredResponse;
import io.github.pgidempotency.TransactionRunner;
import io.github.pgidempotency.VersionCheck;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;

/**
 * The servlet filter: for each request its {@link RouteResolver} marks
 * idempotent, the key is reserved, the rest of the chain runs inside the
 * key's transaction with its response buffered, the response is completed
 * and committed, and only then written to the client. A handler on plain
 * JDBC takes the transaction's connection with {@link #connection(ServletRequest)}
 * (and must neither commit nor close it).
 * <p>
 * An exception that escapes the chain rolls the transaction back (500
 * {@code internal-error}, or the mapping's answer for its SQLSTATE). A
 * framework that answers an exception itself inside the chain (Spring MVC's
 * exception resolvers) must say so with {@link #raised(ServletRequest,
 * Throwable)}: the transaction is then rolled back too and the client gets
 * the response the framework resolved, unless the settings mark the error
 * {@linkplain IdempotencySettings#isFinalError final} (completed with that
 * response, and replayed).
 *
 * <pre>{@code
 * IdempotencyFilter filter = IdempotencyFilter.builder(dataSource)
 *     .scope(request -> accountOf(request))
 *     .routes(Routes.builder().add("POST", "/payments", Route.named("create-payment")).build())
 *     .build();   // checks the extension's version
 * }</pre>
 */
public final class IdempotencyFilter implements Filter {
	/** The request attribute holding the transaction's {@link Connection}. */
	public static final String CONNECTION_ATTRIBUTE = IdempotencyFilter.class.getName() + ".connection";

	/** The request attribute holding the error the handler raised, set by {@link #raised}. */
	public static final String RAISED_ATTRIBUTE = IdempotencyFilter.class.getName() + ".raised";

	private final IdempotencyEngine engine;
	private final RouteResolver routes;
	private final ScopeResolver scope;

	private IdempotencyFilter(Builder b) {
		this.engine = new IdempotencyEngine(b.settings, b.runner != null ? b.runner : new JdbcTransactionRunner(b.dataSource));
		this.routes = b.routes;
		this.scope = b.scope;
	}

	/**
	 * A filter from its parts (no version check: see {@link VersionCheck}).
	 *
	 * @param engine the engine
	 * @param routes the idempotent routes
	 * @param scope the scope function
	 */
	public IdempotencyFilter(IdempotencyEngine engine, RouteResolver routes, ScopeResolver scope) {
		this.engine = Objects.requireNonNull(engine);
		this.routes = Objects.requireNonNull(routes);
		this.scope = Objects.requireNonNull(scope, "an idempotency filter needs a scope function");
	}

	/**
	 * A builder.
	 *
	 * @param dataSource the application's pool: the transactions' connections
	 *        and the version check
	 * @return the builder
	 */
	public static Builder builder(DataSource dataSource) {
		return new Builder(dataSource);
	}

	/**
	 * The connection of the key's transaction, for the handler's own SQL.
	 *
	 * @param request the request, inside the filter
	 * @return the connection
	 * @throws IllegalStateException where the request is not inside an idempotent transaction
	 */
	public static Connection connection(ServletRequest request) {
		Object c = request.getAttribute(CONNECTION_ATTRIBUTE);
		if (!(c instanceof Connection))
			throw new IllegalStateException("this request is not inside an idempotent transaction");
		return (Connection) c;
	}

	/**
	 * Records that the handler raised an error which the framework answers
	 * itself inside the filter chain (its response is the one it writes).
	 * Call it from the framework's exception handling; the Spring Boot
	 * starter does it for every exception Spring MVC resolves. Outside an
	 * idempotent request it does nothing that matters.
	 *
	 * @param request the request
	 * @param error what the handler raised
	 */
	public static void raised(ServletRequest request, Throwable error) {
		request.setAttribute(RAISED_ATTRIBUTE, java.util.Objects.requireNonNull(error));
	}

	@Override
	public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain)
		throws IOException, ServletException {
		if (!(req instanceof HttpServletRequest request) || !(res instanceof HttpServletResponse response)) {
			chain.doFilter(req, res);
			return;
		}
		Route route = routes.resolve(request);
		if (route == null) {
			chain.doFilter(req, res);
			return;
		}
		long limit = engine.settings().maxRequestBody();
		byte[] body = request.getContentLengthLong() > limit ? null : readAtMost(request, limit);
		if (body == null) {
			// before anything is reserved, and without reading it whole
			write(new IdempotencyResult.Refused(engine.settings().mapping().problem(ProblemCode.PAYLOAD_TOO_LARGE,
				null, engine.settings().retryAfterSeconds()), null), response, null);
			return;
		}
		CachedBodyRequest wrapped = new CachedBodyRequest(request, body);
		IncomingRequest incoming = new IncomingRequest(request.getMethod(), request.getRequestURI(),
			Collections.list(request.getHeaders(IdempotencyKeys.HEADER)), request.getContentType(), body);
		BufferedResponse[] buffered = {null};
		IdempotencyResult result = engine.execute(incoming, route, () -> scope.resolve(wrapped), connection -> {
			BufferedResponse b = new BufferedResponse(response);
			buffered[0] = b;
			if (connection != null)
				wrapped.setAttribute(CONNECTION_ATTRIBUTE, connection);
			wrapped.removeAttribute(RAISED_ATTRIBUTE);
			Object raised;
			try {
				chain.doFilter(wrapped, b);
			} finally {
				wrapped.removeAttribute(CONNECTION_ATTRIBUTE);
				raised = wrapped.getAttribute(RAISED_ATTRIBUTE);
				wrapped.removeAttribute(RAISED_ATTRIBUTE);
			}
			if (wrapped.isAsyncStarted())
				throw new IllegalStateException("an idempotent handler cannot be asynchronous");
			if (raised instanceof Throwable error)
				throw new RaisedError(error, b.capture());
			return b.capture();
		});
		write(result, response, buffered[0]);
	}

	/** The body, or null where it is over the limit. */
	private static byte[] readAtMost(HttpServletRequest request, long limit) throws IOException {
		byte[] body = request.getInputStream().readNBytes((int) Math.min(limit + 1, Integer.MAX_VALUE - 8));
		return body.length > limit ? null : body;
	}

	/** Sends the result; the transaction has ended. */
	static void write(IdempotencyResult result, HttpServletResponse response, BufferedResponse buffered)
		throws IOException {
		if (result instanceof IdempotencyResult.Handled) {
			buffered.commitTo(response);
			return;
		}
		response.reset();
		byte[] body;
		if (result instanceof IdempotencyResult.Replayed replayed) {
			StoredResponse stored = replayed.response();
			response.setStatus(stored.status());
			for (Map.Entry<String, String> h : stored.headers().entrySet())
				response.setHeader(h.getKey(), h.getValue());
			response.setHeader(IdempotencyResult.Replayed.HEADER, "true");
			body = stored.body();
		} else {
			Problem problem = ((IdempotencyResult.Refused) result).problem();
			response.setStatus(problem.status());
			problem.headers().forEach(response::setHeader);
			body = problem.body();
		}
		response.setContentLength(body.length);
		response.getOutputStream().write(body);
		response.flushBuffer();
	}

	/** Builds an {@link IdempotencyFilter}. */
	public static final class Builder {
		private final DataSource dataSource;
		private IdempotencySettings settings = IdempotencySettings.defaults();
		private RouteResolver routes = Routes.everyPostAndPatch(Route.defaults());
		private ScopeResolver scope;
		private TransactionRunner runner;
		private boolean checkVersion = true;

		private Builder(DataSource dataSource) {
			this.dataSource = Objects.requireNonNull(dataSource);
		}

		/**
		 * The settings.
		 *
		 * @param settings the settings (default: {@link IdempotencySettings#defaults()})
		 * @return this builder
		 */
		public Builder settings(IdempotencySettings settings) {
			this.settings = Objects.requireNonNull(settings);
			return this;
		}

		/**
		 * The idempotent routes.
		 *
		 * @param routes the resolver (default: every POST and PATCH)
		 * @return this builder
		 */
		public Builder routes(RouteResolver routes) {
			this.routes = Objects.requireNonNull(routes);
			return this;
		}

		/**
		 * The scope function (required).
		 *
		 * @param scope the request's principal
		 * @return this builder
		 */
		public Builder scope(ScopeResolver scope) {
			this.scope = Objects.requireNonNull(scope);
			return this;
		}

		/**
		 * How transactions run.
		 *
		 * @param runner the runner (default: a {@link JdbcTransactionRunner} on the data source)
		 * @return this builder
		 */
		public Builder transactionRunner(TransactionRunner runner) {
			this.runner = Objects.requireNonNull(runner);
			return this;
		}

		/**
		 * Whether {@link #build()} checks the extension's version (default: yes).
		 *
		 * @param check whether to check
		 * @return this builder
		 */
		public Builder checkVersion(boolean check) {
			this.checkVersion = check;
			return this;
		}

		/**
		 * The filter, once the extension's version is checked.
		 *
		 * @return the filter
		 * @throws IllegalStateException without a scope function, or where the
		 *         extension is missing or older than {@link VersionCheck#MINIMUM}
		 */
		public IdempotencyFilter build() {
			if (scope == null)
				throw new IllegalStateException("an idempotency filter needs a scope function: "
					+ "the request's authenticated principal (builder.scope(...))");
			if (checkVersion) {
				try {
					VersionCheck.require(dataSource);
				} catch (SQLException e) {
					throw new IllegalStateException("could not check the idempotency extension's version: "
						+ e.getMessage(), e);
				}
			}
			return new IdempotencyFilter(this);
		}
	}
}
