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

	@Transactional
	public long insertAndFail(String key, String body) {
		insert(key, body);
		throw new IllegalStateException("the processor is down");
	}
}
