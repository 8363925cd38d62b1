package io.github.pgidempotency.spring;

import java.sql.Connection;
import java.util.Objects;

import javax.sql.DataSource;

import io.github.pgidempotency.TransactionRunner;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.jdbc.datasource.DataSourceUtils;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.TransactionSystemException;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * A {@link TransactionRunner} on Spring's transaction manager: the key's
 * transaction is a {@link TransactionTemplate} transaction and its connection
 * is the one bound to the thread ({@link DataSourceUtils#getConnection}), so
 * the handler's {@code JdbcTemplate} and {@code @Transactional} code (with
 * the default propagation) run on it.
 */
public final class SpringTransactionRunner implements TransactionRunner {
	private final TransactionTemplate template;
	private final DataSource dataSource;

	/**
	 * A runner.
	 *
	 * @param transactionManager the application's transaction manager
	 * @param dataSource the data source it manages (a
	 *        {@link DataSourceTransactionManager}'s own is taken where it has one)
	 */
	public SpringTransactionRunner(PlatformTransactionManager transactionManager, DataSource dataSource) {
		this.template = new TransactionTemplate(Objects.requireNonNull(transactionManager));
		this.dataSource = transactionManager instanceof DataSourceTransactionManager d && d.getDataSource() != null
			? d.getDataSource() : Objects.requireNonNull(dataSource);
	}

	@Override
	public <T> T inTransaction(Work<T> work) throws Exception {
		if (TransactionSynchronizationManager.isActualTransactionActive())
			throw new IllegalStateException("an idempotent request cannot run inside a transaction that is already "
				+ "open: the key's transaction must be the one that commits before the response is sent");
		try {
			return template.execute(status -> {
				Connection c = DataSourceUtils.getConnection(dataSource);
				try {
					return work.run(c, new Control() {
						@Override
						public void setRollbackOnly() {
							status.setRollbackOnly();
						}

						@Override
						public boolean isRollbackOnly() {
							// a joined @Transactional method that threw marks it too
							return status.isRollbackOnly();
						}
					});
				} catch (RuntimeException e) {
					throw e;
				} catch (Exception e) {
					throw new Checked(e);
				} finally {
					DataSourceUtils.releaseConnection(c, dataSource);
				}
			});
		} catch (Checked e) {
			throw (Exception) e.getCause();
		} catch (TransactionSystemException e) {
			// the rollback after the work's error failed too (the connection
			// was lost): the work's error is the one that says what happened
			Throwable raised = e.getApplicationException();
			if (raised == null)
				throw e;
			if (raised instanceof Checked)
				raised = raised.getCause();
			raised.addSuppressed(e);
			if (raised instanceof Exception ex)
				throw ex;
			throw (Error) raised;
		}
	}

	/** A checked exception of the work, carried through the template (which rolls back). */
	private static final class Checked extends RuntimeException {
		private static final long serialVersionUID = 1L;

		Checked(Exception cause) {
			super(cause);
		}
	}
}
