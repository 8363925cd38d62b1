package io.github.pgidempotency;

import java.sql.Connection;
import java.sql.SQLException;

import javax.sql.DataSource;

/**
 * A {@link TransactionRunner} on a JDBC {@link DataSource} (a HikariCP pool,
 * pgjdbc's {@code PGSimpleDataSource}): each transaction borrows a
 * connection, turns auto-commit off, commits or rolls back, and gives the
 * connection back as it found it.
 */
public final class JdbcTransactionRunner implements TransactionRunner {
	private final DataSource dataSource;

	/**
	 * A runner on a data source.
	 *
	 * @param dataSource the application's pool
	 */
	public JdbcTransactionRunner(DataSource dataSource) {
		this.dataSource = java.util.Objects.requireNonNull(dataSource);
	}

	@Override
	public <T> T inTransaction(Work<T> work) throws Exception {
		try (Connection c = dataSource.getConnection()) {
			boolean autoCommit = c.getAutoCommit();
			c.setAutoCommit(false);
			try {
				boolean[] rollback = {false};
				T result = work.run(c, new Control() {
					@Override
					public void setRollbackOnly() {
						rollback[0] = true;
					}

					@Override
					public boolean isRollbackOnly() {
						return rollback[0];
					}
				});
				if (rollback[0])
					c.rollback();
				else
					c.commit();
				return result;
			} catch (Throwable t) {
				try {
					c.rollback();
				} catch (SQLException e) {
					t.addSuppressed(e);
				}
				throw t;
			} finally {
				try {
					c.setAutoCommit(autoCommit);
				} catch (SQLException e) {
					// a broken connection: the pool discards it
				}
			}
		}
	}
}
