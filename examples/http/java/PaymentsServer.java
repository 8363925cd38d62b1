/*
 * A small payment API that honours the Idempotency-Key header, in Java with
 * JDBC (the PostgreSQL JDBC driver) and the JDK's com.sun.net.httpserver.
 * The HTTP contract is doc/http.md's, the same for the Python,
 * Node.js and Go services:
 *
 *   POST /payments   Idempotency-Key: <key>   X-Account-Id: <scope>
 *   {"order_id": "order-842", "amount": 10000, "currency": "BRL"}
 *
 *   201 the payment was made; 402 the card was declined (final, replayed);
 *   400 missing or invalid key (SQLSTATE 22023) or a bad body; 409 in
 *   progress or stuck, with Retry-After; 422 the key was used with another
 *   request; a retry gets the stored status and body with
 *   "Idempotent-Replayed: true".
 *
 * The key is reserved, the payment written and the answer stored in one
 * transaction (idem_reserve, INSERT, idem_complete), committed before the
 * answer is sent.  The JDK has no JSON library: the database parses the
 * request (as jsonb) and builds the response bodies.
 *
 * Build: javac -cp /usr/share/java/postgresql.jar -d classes PaymentsServer.java
 * Run:   JDBC_URL='jdbc:postgresql://127.0.0.1:5432/db?user=app' \
 *        java -cp classes:/usr/share/java/postgresql.jar PaymentsServer \
 *        [--port N] [--port-file F] [--max-seconds S]
 * It listens on 127.0.0.1 only.  Behind a transaction-pooling PgBouncer, add
 * prepareThreshold=0 to the URL.
 */

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.postgresql.util.PSQLException;

public final class PaymentsServer {
	static final String OPERATION = "create-payment";
	static final long DECLINE_ABOVE = 1_000_000; // cents; larger payments are declined
	static final int MAX_BODY = 64 * 1024;
	static final int MAX_LATENCY_MS = 5000;
	static final int POOL_SIZE = 16;

	/** What the client is told: a status, an error code and a sentence. */
	record Answer(int status, String code, String message) {
	}

	/** The outcomes of idem_reserve that answer without running the effect. */
	static final Map<String, Answer> REFUSED = Map.of(
		"in_progress", new Answer(409, "in_progress", "a request with this Idempotency-Key is in progress; retry later"),
		"stuck", new Answer(409, "stuck", "the outcome of the request with this Idempotency-Key is being checked"),
		"mismatch", new Answer(422, "mismatch", "this Idempotency-Key was already used with another request"));

	/**
	 * SQLSTATEs of the extension (JDBC: SQLException.getSQLState()) and what
	 * the client is told; a null message means the server's, which names the
	 * argument.
	 */
	static final Map<String, Answer> SQLSTATE_HTTP = Map.of(
		"22023", new Answer(400, "invalid_request", null),
		"ID003", REFUSED.get("in_progress"), // idem_call's outcomes as errors
		"ID004", REFUSED.get("mismatch"),
		"ID005", REFUSED.get("stuck"),
		"ID001", new Answer(500, "internal_error", "internal error"), // a bug in the caller
		"ID002", new Answer(500, "internal_error", "internal error"),
		"25006", new Answer(503, "read_only", "the database is read-only; retry later"));

	/** One POST /payments' answer. */
	record Result(int status, String body, boolean replayed) {
	}

	/** A validated request. */
	record Payment(String orderId, long amount, String currency) {
	}

	static final class BadRequest extends Exception {
		private static final long serialVersionUID = 1L;

		BadRequest(String message) {
			super(message);
		}
	}

	private final String url;
	private final BlockingQueue<Connection> idle = new ArrayBlockingQueue<>(POOL_SIZE);

	PaymentsServer(String url) {
		this.url = url;
	}

	static String jsonString(String s) {
		StringBuilder b = new StringBuilder("\"");
		for (char c : s.toCharArray()) {
			switch (c) {
				case '"' -> b.append("\\\"");
				case '\\' -> b.append("\\\\");
				default -> {
					if (c < 0x20)
						b.append(String.format("\\u%04x", (int) c));
					else
						b.append(c);
				}
			}
		}
		return b.append('"').toString();
	}

	static String errorBody(String code, String message) {
		return "{\"error\": " + jsonString(code) + ", \"message\": " + jsonString(message) + "}";
	}

	/** A connection from the pool (at most POOL_SIZE are open at once). */
	Connection borrow() throws SQLException {
		Connection c = idle.poll();
		return c != null ? c : DriverManager.getConnection(url);
	}

	/** Back to the pool, unless it broke or the pool is full. */
	void giveBack(Connection c) {
		try {
			if (c.isClosed() || !c.getAutoCommit() || !idle.offer(c))
				c.close();
		} catch (SQLException e) {
			// it is gone either way
		}
	}

	/** The request checked by the database's JSON parser. */
	static Payment parsePayment(Connection c, String raw) throws SQLException, BadRequest {
		try (PreparedStatement st = c.prepareStatement(
			"SELECT jsonb_typeof(b), jsonb_typeof(b->'order_id'), b->>'order_id', "
			+ "jsonb_typeof(b->'amount'), b->>'amount', jsonb_typeof(b->'currency'), b->>'currency' "
			+ "FROM (SELECT ?::jsonb AS b) AS request")) {
			st.setString(1, raw);
			ResultSet rs;
			try {
				rs = st.executeQuery();
			} catch (SQLException e) {
				if ("22P02".equals(e.getSQLState()))
					throw new BadRequest("the body is not JSON");
				throw e;
			}
			rs.next();
			if (!"object".equals(rs.getString(1)))
				throw new BadRequest("the body must be a JSON object");
			if (!"string".equals(rs.getString(2)) || rs.getString(3).isEmpty())
				throw new BadRequest("\"order_id\" must be a non-empty string");
			long amount;
			try {
				amount = "number".equals(rs.getString(4)) ? Long.parseLong(rs.getString(5)) : 0;
			} catch (NumberFormatException e) {
				amount = 0;
			}
			if (amount <= 0)
				throw new BadRequest("\"amount\" must be a positive integer (cents)");
			if (!"string".equals(rs.getString(6)) || rs.getString(7).length() != 3)
				throw new BadRequest("\"currency\" must be a three-letter code");
			return new Payment(rs.getString(3), amount, rs.getString(7));
		}
	}

	/** One POST /payments, in one transaction. */
	Result create(String scope, String key, String raw, int latencyMs) throws SQLException, BadRequest {
		Connection c = borrow();
		try {
			Payment p = parsePayment(c, raw);
			c.setAutoCommit(false);
			try {
				Result r = createInTransaction(c, scope, key, raw, p, latencyMs);
				c.commit();
				return r;
			} catch (SQLException e) {
				c.rollback();
				Answer a = SQLSTATE_HTTP.get(e.getSQLState());
				if (a == null)
					throw e;
				String message = a.message() != null ? a.message() : primaryMessage(e);
				return new Result(a.status(), errorBody(a.code(), message), false);
			} finally {
				c.setAutoCommit(true);
			}
		} catch (SQLException e) {
			c.close();
			throw e;
		} finally {
			giveBack(c);
		}
	}

	static Result createInTransaction(Connection c, String scope, String key, String raw, Payment p,
		int latencyMs) throws SQLException {
		String outcome;
		int responseStatus;
		String response;
		try (PreparedStatement st = c.prepareStatement(
			"SELECT outcome, response_status, response FROM idem_reserve(?, ?, ?::jsonb, scope => ?)")) {
			st.setString(1, OPERATION);
			st.setString(2, key);
			st.setString(3, raw);
			st.setString(4, scope);
			try (ResultSet rs = st.executeQuery()) {
				rs.next();
				outcome = rs.getString(1);
				responseStatus = rs.getInt(2);
				response = rs.getString(3);
			}
		}
		if (outcome.equals("replay"))
			return new Result(responseStatus, response, true);
		Answer refused = REFUSED.get(outcome);
		if (refused != null)
			return new Result(refused.status(), errorBody(refused.code(), refused.message()), false);

		// new: this request owns the key
		int status = 402;
		String body = errorBody("card_declined", "the card was declined");
		String resourceId = null;
		if (p.amount() <= DECLINE_ABOVE) {
			// The body is built as jsonb, the form idem_complete stores, so
			// that replays are the same document
			try (PreparedStatement st = c.prepareStatement(
				"INSERT INTO payments (account, order_id, amount, currency) VALUES (?, ?, ?, ?) "
				+ "RETURNING id, jsonb_build_object('id', id, 'order_id', order_id, 'amount', amount, "
				+ "'currency', currency, 'status', 'paid')")) {
				st.setString(1, scope);
				st.setString(2, p.orderId());
				st.setLong(3, p.amount());
				st.setString(4, p.currency());
				try (ResultSet rs = st.executeQuery()) {
					rs.next();
					resourceId = Long.toString(rs.getLong(1));
					body = rs.getString(2);
				}
			}
			status = 201;
		}
		if (latencyMs > 0) {
			try {
				Thread.sleep(latencyMs);
			} catch (InterruptedException e) {
				Thread.currentThread().interrupt();
			}
		}
		try (PreparedStatement st = c.prepareStatement("SELECT idem_complete(?, ?, ?::jsonb, ?, ?, ?)")) {
			st.setString(1, OPERATION);
			st.setString(2, key);
			st.setString(3, body);
			st.setInt(4, status);
			if (resourceId != null)
				st.setString(5, resourceId);
			else
				st.setNull(5, Types.VARCHAR);
			st.setString(6, scope);
			st.execute();
		}
		return new Result(status, body, false);
	}

	/** The server's primary message, without the detail and hint. */
	static String primaryMessage(SQLException e) {
		if (e instanceof PSQLException pe && pe.getServerErrorMessage() != null)
			return pe.getServerErrorMessage().getMessage();
		return e.getMessage();
	}

	static void reply(HttpExchange ex, int status, String body) throws IOException {
		byte[] data = body.getBytes(StandardCharsets.UTF_8);
		ex.getResponseHeaders().set("Content-Type", "application/json");
		ex.sendResponseHeaders(status, data.length);
		try (OutputStream out = ex.getResponseBody()) {
			out.write(data);
		}
	}

	void payments(HttpExchange ex) throws IOException {
		if (!ex.getRequestMethod().equals("POST") || !ex.getRequestURI().getPath().equals("/payments")) {
			reply(ex, 404, errorBody("not_found", "not found"));
			return;
		}
		byte[] rawBytes;
		try (InputStream in = ex.getRequestBody()) {
			rawBytes = in.readNBytes(MAX_BODY + 1);
		}
		if (rawBytes.length > MAX_BODY) {
			reply(ex, 400, errorBody("bad_request", "the body is too large"));
			return;
		}
		String key = ex.getRequestHeaders().getFirst("Idempotency-Key");
		if (key == null) {
			reply(ex, 400, errorBody("missing_key", "the Idempotency-Key header is required"));
			return;
		}
		String scope = ex.getRequestHeaders().getFirst("X-Account-Id");
		if (scope == null)
			scope = "public";
		int latencyMs;
		try {
			String v = ex.getRequestHeaders().getFirst("X-Simulated-Latency-Ms");
			latencyMs = Math.min(Math.max(v == null ? 0 : Integer.parseInt(v), 0), MAX_LATENCY_MS);
		} catch (NumberFormatException e) {
			reply(ex, 400, errorBody("bad_request", "bad X-Simulated-Latency-Ms"));
			return;
		}

		Result r;
		try {
			r = create(scope, key, new String(rawBytes, StandardCharsets.UTF_8), latencyMs);
		} catch (BadRequest e) {
			reply(ex, 400, errorBody("bad_request", e.getMessage()));
			return;
		} catch (SQLException e) {
			System.err.println("server: database error " + e.getSQLState() + ": " + e.getMessage());
			reply(ex, 500, errorBody("internal_error", "internal error"));
			return;
		}
		if (r.replayed())
			ex.getResponseHeaders().set("Idempotent-Replayed", "true");
		if (r.status() == 409 || r.status() == 503)
			ex.getResponseHeaders().set("Retry-After", "1");
		reply(ex, r.status(), r.body());
	}

	public static void main(String[] args) throws Exception {
		int port = 0;
		String portFile = null;
		double maxSeconds = 300;
		for (int i = 0; i + 1 < args.length; i += 2) {
			switch (args[i]) {
				case "--port" -> port = Integer.parseInt(args[i + 1]);
				case "--port-file" -> portFile = args[i + 1];
				case "--max-seconds" -> maxSeconds = Double.parseDouble(args[i + 1]);
				default -> throw new IllegalArgumentException("unknown option " + args[i]);
			}
		}
		String url = System.getenv().getOrDefault("JDBC_URL", "jdbc:postgresql://127.0.0.1:5432/postgres");
		PaymentsServer service = new PaymentsServer(url);

		HttpServer server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 64);
		ExecutorService workers = Executors.newFixedThreadPool(POOL_SIZE);
		server.setExecutor(workers);
		server.createContext("/healthz", ex -> reply(ex, 200, "{\"status\": \"ok\"}"));
		server.createContext("/", ex -> {
			try {
				service.payments(ex);
			} catch (RuntimeException e) {
				System.err.println("server: " + e);
				reply(ex, 500, errorBody("internal_error", "internal error"));
			}
		});
		server.start();

		int actual = server.getAddress().getPort();
		if (portFile != null) {
			Path tmp = Path.of(portFile + ".tmp");
			Files.writeString(tmp, actual + "\n");
			Files.move(tmp, Path.of(portFile), StandardCopyOption.ATOMIC_MOVE);
		}
		System.err.println("server: listening on 127.0.0.1:" + actual);

		Thread stopper = new Thread(() -> {
			server.stop(1);
			workers.shutdown();
			System.err.println("server: stopped");
		});
		Runtime.getRuntime().addShutdownHook(stopper);
		TimeUnit.MILLISECONDS.sleep((long) (maxSeconds * 1000));
		System.exit(0);
	}
}
