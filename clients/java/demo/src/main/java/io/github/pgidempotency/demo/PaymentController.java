package io.github.pgidempotency.demo;

import java.net.URI;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.pgidempotency.spring.Idempotent;
import jakarta.servlet.http.HttpServletRequest;
import org.springframework.http.MediaType;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

/** POST /payments (idempotent) and GET /payments/{id}. */
@RestController
public class PaymentController {
	static final long DECLINE_ABOVE = 1_000_000;
	static final int MAX_LATENCY_MS = 5000;

	private final JdbcTemplate jdbc;
	private final Accounts accounts;
	private final Problems problems;
	private final ObjectMapper json = new ObjectMapper();

	PaymentController(JdbcTemplate jdbc, Accounts accounts, Problems problems) {
		this.jdbc = jdbc;
		this.accounts = accounts;
		this.problems = problems;
	}

	/**
	 * Makes a payment, in the key's transaction: the INSERT, the record and
	 * the answer commit together.
	 *
	 * @param body the request body
	 * @param latency X-Simulated-Latency-Ms
	 * @param request the request
	 * @return 201, or 400 bad-request (both completed)
	 * @throws InterruptedException when stopped while sleeping
	 * @throws CardDeclinedException for an amount over 1000000: 402
	 *         card-declined, completed as a final error
	 */
	@PostMapping("/payments")
	@Idempotent(operation = "create-payment")
	public ResponseEntity<String> create(@RequestBody(required = false) byte[] body,
		@RequestHeader(value = "X-Simulated-Latency-Ms", required = false) String latency,
		HttpServletRequest request) throws InterruptedException {
		String account = accounts.accountOf(request);
		JsonNode p;
		try {
			p = body == null ? null : json.readTree(body);
		} catch (java.io.IOException e) {
			p = null;
		}
		String error = validate(p);
		if (error != null)
			return problems.problem(400, "bad-request", "Not a payment", error);
		String orderId = p.get("order_id").asText();
		long amount = p.get("amount").asLong();
		String currency = p.get("currency").asText();
		boolean declined = amount > DECLINE_ABOVE;
		Map<String, Object> row = jdbc.queryForMap("INSERT INTO payments (account, order_id, amount, currency, status) "
			+ "VALUES (?, ?, ?, ?, ?) RETURNING id, jsonb_build_object('id', id, 'order_id', order_id, "
			+ "'amount', amount, 'currency', currency, 'status', status)::text AS body",
			account, orderId, amount, currency, declined ? "declined" : "paid");
		sleep(latency);
		if (declined)
			throw new CardDeclinedException();
		return ResponseEntity.created(URI.create("/payments/" + row.get("id")))
			.contentType(MediaType.APPLICATION_JSON).body((String) row.get("body"));
	}

	/**
	 * The answer to a declined card; the library completes it (a final error).
	 *
	 * @param e the error
	 * @return 402 card-declined
	 */
	@ExceptionHandler
	public ResponseEntity<String> declined(CardDeclinedException e) {
		return problems.problem(402, "card-declined", "Card declined", "The card was declined.");
	}

	/**
	 * A payment of the caller's account.
	 *
	 * @param id the payment's id
	 * @param request the request
	 * @return 200, 401 or 404
	 */
	@GetMapping("/payments/{id}")
	public ResponseEntity<String> get(@PathVariable String id, HttpServletRequest request) {
		String account = accounts.accountOf(request);
		if (account == null)
			return problems.problem(401, "unauthenticated", "Unauthenticated", "The request has no valid bearer token.");
		if (!id.matches("[0-9]{1,18}"))
			return problems.problem(404, "not-found", "Not found", "There is no such payment.");
		var found = jdbc.queryForList("SELECT jsonb_build_object('id', id, 'order_id', order_id, 'amount', amount, "
			+ "'currency', currency, 'status', status)::text FROM payments WHERE id = ? AND account = ?",
			String.class, Long.parseLong(id), account);
		if (found.isEmpty())
			return problems.problem(404, "not-found", "Not found", "There is no such payment.");
		return ResponseEntity.ok().contentType(MediaType.APPLICATION_JSON).body(found.get(0));
	}

	/**
	 * Liveness.
	 *
	 * @return 200
	 */
	@GetMapping("/healthz")
	public String healthz() {
		return "ok";
	}

	/** Why a body is not a payment, or null. */
	static String validate(JsonNode p) {
		if (p == null || !p.isObject())
			return "The body must be a JSON object.";
		JsonNode orderId = p.get("order_id");
		if (orderId == null || !orderId.isTextual() || orderId.asText().isEmpty())
			return "\"order_id\" must be a non-empty string.";
		JsonNode amount = p.get("amount");
		if (amount == null || !amount.isIntegralNumber() || !amount.canConvertToLong() || amount.asLong() <= 0)
			return "\"amount\" must be a positive integer.";
		JsonNode currency = p.get("currency");
		if (currency == null || !currency.isTextual() || !currency.asText().matches("[A-Za-z]{3}"))
			return "\"currency\" must be three letters.";
		return null;
	}

	/** X-Simulated-Latency-Ms: a slow processor, after the INSERT and before the commit. */
	static void sleep(String latency) throws InterruptedException {
		if (latency == null)
			return;
		try {
			long ms = Math.min(Long.parseLong(latency.trim()), MAX_LATENCY_MS);
			if (ms > 0)
				Thread.sleep(ms);
		} catch (NumberFormatException e) {
			// not a number: no latency
		}
	}
}
