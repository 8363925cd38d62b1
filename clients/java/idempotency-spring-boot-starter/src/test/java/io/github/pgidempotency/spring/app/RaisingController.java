package io.github.pgidempotency.spring.app;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

import io.github.pgidempotency.spring.Idempotent;
import org.springframework.http.HttpStatus;
import org.springframework.http.MediaType;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.ResponseStatus;
import org.springframework.web.bind.annotation.RestController;
import org.springframework.web.server.ResponseStatusException;

/**
 * Handlers that INSERT and then raise an exception Spring MVC resolves to
 * 402, in each of its ways, from the controller and from a
 * {@code @Transactional} service that joined the key's transaction.
 */
@RestController
@RequestMapping("/raise")
public class RaisingController {
	/** How many times each key's handler ran. */
	public static final Map<String, AtomicInteger> CALLS = new ConcurrentHashMap<>();

	/** 402 by its annotation. */
	@ResponseStatus(HttpStatus.PAYMENT_REQUIRED)
	public static class Declined extends RuntimeException {
		private static final long serialVersionUID = 1L;
	}

	/** 402 by its annotation; final by an IdempotencySettingsCustomizer's predicate. */
	@ResponseStatus(HttpStatus.PAYMENT_REQUIRED)
	public static class FinalAnnotated extends RuntimeException {
		private static final long serialVersionUID = 1L;
	}

	/** 402 with a body by the @ExceptionHandler below. */
	public static class Refused extends RuntimeException {
		private static final long serialVersionUID = 1L;
		final long payment;

		Refused(long payment) {
			this.payment = payment;
		}
	}

	/** 402 with a body by the @ExceptionHandler below; final by idempotency.final-errors. */
	public static class FinalRefused extends Refused {
		private static final long serialVersionUID = 1L;

		FinalRefused(long payment) {
			super(payment);
		}
	}

	private final JdbcTemplate jdbc;
	private final PaymentService service;

	RaisingController(JdbcTemplate jdbc, PaymentService service) {
		this.jdbc = jdbc;
		this.service = service;
	}

	@PostMapping("/{how}")
	@Idempotent
	ResponseEntity<String> raise(@RequestHeader("Idempotency-Key") String key, @PathVariable String how,
		@RequestBody String body) {
		CALLS.computeIfAbsent(key, k -> new AtomicInteger()).incrementAndGet();
		if (how.endsWith("service"))
			service.insertAndDecline(key, body, how.startsWith("final"));
		long id = jdbc.queryForObject("INSERT INTO spring_effects (k, body) VALUES (?, ?) RETURNING id", Long.class,
			key, body);
		switch (how) {
			case "status" -> throw new ResponseStatusException(HttpStatus.PAYMENT_REQUIRED, "declined");
			case "annotated" -> throw new Declined();
			case "handled" -> throw new Refused(id);
			case "final-annotated" -> throw new FinalAnnotated();
			case "final-handled" -> throw new FinalRefused(id);
			case "big" -> {
				return ResponseEntity.ok("x".repeat(2000));
			}
			default -> {
				return ResponseEntity.ok("returned");
			}
		}
	}

	@ExceptionHandler
	ResponseEntity<Map<String, Object>> refused(Refused e) {
		return ResponseEntity.status(HttpStatus.PAYMENT_REQUIRED).contentType(MediaType.APPLICATION_PROBLEM_JSON)
			.body(Map.of("code", "card-declined", "payment", e.payment));
	}
}
