package io.github.pgidempotency.spring.app;

import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;
import org.springframework.transaction.support.TransactionSynchronizationManager;

/** @Transactional code the handlers call: it joins the key's transaction. */
@Service
public class PaymentService {
	private final JdbcTemplate jdbc;

	PaymentService(JdbcTemplate jdbc) {
		this.jdbc = jdbc;
	}

	@Transactional
	public long insert(String key, String body) {
		if (!TransactionSynchronizationManager.isActualTransactionActive())
			throw new IllegalStateException("no transaction");
		return jdbc.queryForObject("INSERT INTO spring_effects (k, body) VALUES (?, ?) RETURNING id", Long.class,
			key, body);
	}

	/** Inserts, then declines: a 402 (a final error where {@code asFinal}) from a joined transaction. */
	@Transactional
	public long insertAndDecline(String key, String body, boolean asFinal) {
		insert(key, body);
		if (asFinal)
			throw new RaisingController.FinalRefused(0);
		throw new org.springframework.web.server.ResponseStatusException(
			org.springframework.http.HttpStatus.PAYMENT_REQUIRED, "declined");
	}

	@Transactional
	public long insertAndFail(String key, String body) {
		insert(key, body);
		throw new IllegalStateException("the processor is down");
	}
}
