package io.github.pgidempotency.spring.app;

import io.github.pgidempotency.spring.Idempotent;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PatchMapping;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.RestController;

/** @Idempotent on a class: its POST and PATCH methods. */
@RestController
@RequestMapping("/items")
@Idempotent
public class ItemController {
	@PatchMapping("/{id}")
	String patch(@PathVariable String id) {
		return "patched " + id + " " + TransactionSynchronizationManager.isActualTransactionActive();
	}

	@GetMapping("/{id}")
	String get(@PathVariable String id) {
		return "item " + id + " " + TransactionSynchronizationManager.isActualTransactionActive();
	}
}
