package io.github.pgidempotency.spring.app;

import java.net.URI;
import java.util.Map;

import io.github.pgidempotency.spring.Idempotent;
import org.springframework.http.HttpStatus;
import org.springframework.http.MediaType;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

/** Handlers that write through JdbcTemplate and a @Transactional service. */
@RestController
public class PaymentController {
	private final PaymentService service;
	private final JdbcTemplate jdbc;

	PaymentController(PaymentService service, JdbcTemplate jdbc) {
		this.service = service;
		this.jdbc = jdbc;
	}

	@PostMapping("/payments")
	@Idempotent(operation = "create-payment")
	ResponseEntity<Map<String, Object>> create(@RequestHeader("Idempotency-Key") String key, @RequestBody String body) {
		long id = service.insert(key, body);
		// the handler's JdbcTemplate runs in the key's transaction
		Long records = jdbc.queryForObject("SELECT count(*) FROM spring_effects WHERE id = ?", Long.class, id);
		return ResponseEntity.created(URI.create("/payments/" + id)).header("X-Internal", "secret")
			.body(Map.of("id", id, "seen", records));
	}

	@PostMapping("/payments/fail")
	@Idempotent
	ResponseEntity<String> fail(@RequestHeader("Idempotency-Key") String key, @RequestBody String body) {
		service.insertAndFail(key, body);
		return ResponseEntity.ok("unreachable");
	}

	@PostMapping("/payments/sqlstate/{state}")
	@Idempotent
	ResponseEntity<String> sqlState(@RequestHeader("Idempotency-Key") String key, @PathVariable String state,
		@RequestBody String body) {
		if (!state.matches("[0-9A-Z]{5}"))
			throw new IllegalArgumentException("not an SQLSTATE");
		service.insert(key, body);
		jdbc.execute("DO $$ BEGIN RAISE EXCEPTION 'secret text' USING ERRCODE = '" + state + "'; END $$");
		return ResponseEntity.ok("unreachable");
	}

	/** A handler that hangs after its INSERT. */
	@PostMapping("/payments/hung")
	@Idempotent
	ResponseEntity<String> hung(@RequestHeader("Idempotency-Key") String key, @RequestBody String body)
		throws InterruptedException {
		service.insert(key, body);
		Thread.sleep(2500);
		return ResponseEntity.ok("late");
	}

	/** The database ends the session before COMMIT, as a restart would. */
	@PostMapping("/payments/terminated")
	@Idempotent
	ResponseEntity<String> terminated(@RequestHeader("Idempotency-Key") String key, @RequestBody String body) {
		service.insert(key, body);
		jdbc.queryForObject("SELECT pg_terminate_backend(pg_backend_pid())", Boolean.class);
		return ResponseEntity.ok("unreachable");
	}

	@PostMapping("/payments/unavailable")
	@Idempotent
	ResponseEntity<String> unavailable(@RequestHeader("Idempotency-Key") String key, @RequestBody String body) {
		service.insert(key, body);
		return ResponseEntity.status(HttpStatus.SERVICE_UNAVAILABLE).body("later");
	}

	@PostMapping("/payments/declined")
	@Idempotent
	ResponseEntity<Map<String, String>> declined(@RequestHeader("Idempotency-Key") String key,
		@RequestBody String body) {
		service.insert(key, body);
		return ResponseEntity.status(HttpStatus.PAYMENT_REQUIRED).contentType(MediaType.APPLICATION_PROBLEM_JSON)
			.body(Map.of("code", "card-declined"));
	}

	/** Answers a server would not write unchanged, or jsonb could not store unchanged. */
	@PostMapping("/unsendable/{what}")
	@Idempotent
	void unsendable(@RequestHeader("Idempotency-Key") String key, @PathVariable String what,
		@RequestBody String body, jakarta.servlet.http.HttpServletResponse response) throws java.io.IOException {
		service.insert(key, body);
		response.setStatus(201);
		response.setContentType("application/json");
		switch (what) {
			// client text in a Location
			case "crlf" -> response.setHeader("Location", "/payments/" + body);
			case "euro-content-type" -> response.setContentType("text/plain; charset=\u20ac");
			case "header-name" -> response.setHeader("X Bad", "1");
			case "nul-body" -> {
				response.getWriter().write("{\"note\": \"a\\u0000b\"}");
				return;
			}
			case "surrogate-body" -> {
				response.getWriter().write("{\"note\": \"\\ud800\"}");
				return;
			}
			default -> throw new IllegalArgumentException(what);
		}
		response.getWriter().write("{}");
	}

	@PostMapping("/subset")
	@Idempotent(operation = "subset", fingerprint = {"/order_id"})
	ResponseEntity<String> subset(@RequestHeader("Idempotency-Key") String key, @RequestBody String body) {
		service.insert(key, body);
		return ResponseEntity.status(HttpStatus.CREATED).contentType(MediaType.TEXT_PLAIN).body("made " + key);
	}

	@PostMapping("/optional")
	@Idempotent(key = Idempotent.Key.OPTIONAL)
	String optional() {
		return "transaction " + TransactionSynchronizationManager.isActualTransactionActive();
	}

	@PostMapping("/plain")
	String plain() {
		return "transaction " + TransactionSynchronizationManager.isActualTransactionActive();
	}
}
