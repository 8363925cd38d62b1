package io.github.pgidempotency;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

import javax.sql.DataSource;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;

/** The test databases (test.sh creates them): the system property idempotency.test.url. */
final class TestDb {
	static final String URL = System.getProperty("idempotency.test.url",
		"jdbc:postgresql://127.0.0.1:5432/idem_java_test");

	private static HikariDataSource pool;

	private TestDb() {
	}

	/** The URL of a sibling database: idem_java_test_noext, idem_java_test_old. */
	static String sibling(String suffix) {
		int q = URL.indexOf('?');
		String base = q < 0 ? URL : URL.substring(0, q);
		return base + suffix + (q < 0 ? "" : URL.substring(q));
	}

	static synchronized DataSource pool() {
		if (pool == null)
			pool = pool(URL, null);
		return pool;
	}

	static HikariDataSource pool(String url, String initSql) {
		HikariConfig c = new HikariConfig();
		c.setJdbcUrl(url);
		c.setMaximumPoolSize(4);
		if (initSql != null)
			c.setConnectionInitSql(initSql);
		return new HikariDataSource(c);
	}

	static void sql(String sql, Object... args) {
		try (Connection c = pool().getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
			for (int i = 0; i < args.length; i++)
				st.setObject(i + 1, args[i]);
			st.execute();
		} catch (SQLException e) {
			throw new RuntimeException(e);
		}
	}

	static String value(String sql, Object... args) {
		try (Connection c = pool().getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
			for (int i = 0; i < args.length; i++)
				st.setObject(i + 1, args[i]);
			try (ResultSet rs = st.executeQuery()) {
				return rs.next() ? rs.getString(1) : null;
			}
		} catch (SQLException e) {
			throw new RuntimeException(e);
		}
	}

	static long count(String sql, Object... args) {
		return Long.parseLong(value(sql, args));
	}
}
