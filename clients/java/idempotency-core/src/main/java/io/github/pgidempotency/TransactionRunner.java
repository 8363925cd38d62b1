package io.github.pgidempotency;

import java.sql.Connection;

/**
 * Runs work in one database transaction on one connection. The library's
 * calls and the handler's own SQL go through the connection it hands over;
 * {@link JdbcTransactionRunner} does it on a {@link javax.sql.DataSource},
 * the Spring Boot starter through Spring's transaction manager.
 */
public interface TransactionRunner {
	/**
	 * Begins a transaction, runs the work and commits it, or rolls it back
	 * where the work threw or called {@link Control#setRollbackOnly()}.
	 *
	 * @param <T> what the work returns
	 * @param work the work
	 * @return what the work returned, once the transaction has ended
	 * @throws Exception what the work threw, or the commit's failure
	 */
	<T> T inTransaction(Work<T> work) throws Exception;

	/**
	 * Work in a transaction.
	 *
	 * @param <T> what it returns
	 */
	@FunctionalInterface
	interface Work<T> {
		/**
		 * Does the work.
		 *
		 * @param connection the transaction's connection
		 * @param control to roll back instead of committing
		 * @return the result
		 * @throws Exception to roll back
		 */
		T run(Connection connection, Control control) throws Exception;
	}

	/** How work asks for a rollback without throwing. */
	interface Control {
		/** The transaction is rolled back when the work returns. */
		void setRollbackOnly();

		/**
		 * Whether the transaction can no longer commit: the work asked for a
		 * rollback, or code that joined the transaction marked it (a Spring
		 * {@code @Transactional} method that threw).
		 *
		 * @return whether it will be rolled back; {@code false} where the
		 *         runner cannot tell
		 */
		default boolean isRollbackOnly() {
			return false;
		}
	}
}
