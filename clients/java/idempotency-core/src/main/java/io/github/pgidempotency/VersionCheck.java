package io.github.pgidempotency;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

import javax.sql.DataSource;

/**
 * The start-up check: the database has the {@code idempotency} extension at
 * version 0.2.0 or later (the first with the {@code scope} and {@code ttl}
 * arguments the library's calls use).
 */
public final class VersionCheck {
	/** The oldest extension version the library works with. */
	public static final String MINIMUM = "0.2.0";

	private VersionCheck() {
	}

	/**
	 * Checks the database of a data source.
	 *
	 * @param dataSource the application's data source
	 * @return the extension version found
	 * @throws IllegalStateException where the extension is missing or too old
	 * @throws SQLException where the database cannot be asked
	 */
	public static String require(DataSource dataSource) throws SQLException {
		try (Connection c = dataSource.getConnection()) {
			return require(c);
		}
	}

	/**
	 * Checks the database of a connection.
	 *
	 * @param connection a connection, which is left as it was
	 * @return the extension version found
	 * @throws IllegalStateException where the extension is missing or too old
	 * @throws SQLException where the database cannot be asked
	 */
	public static String require(Connection connection) throws SQLException {
		String version = null;
		try (PreparedStatement st = connection.prepareStatement(
			"SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'idempotency'");
			ResultSet rs = st.executeQuery()) {
			if (rs.next())
				version = rs.getString(1);
		}
		if (version == null)
			throw new IllegalStateException("the idempotency extension is not installed in database \""
				+ connection.getCatalog() + "\": run CREATE EXTENSION idempotency (version " + MINIMUM
				+ " or later is required)");
		if (compare(version, MINIMUM) < 0)
			throw new IllegalStateException("the idempotency extension in database \"" + connection.getCatalog()
				+ "\" is version " + version + ", older than " + MINIMUM
				+ ", which this library requires: run ALTER EXTENSION idempotency UPDATE");
		return version;
	}

	/**
	 * Compares two dotted versions numerically ({@code 0.10.0} after {@code 0.9.1}).
	 *
	 * @param a a version
	 * @param b another
	 * @return negative, zero or positive as {@code a} is older, the same or newer
	 */
	static int compare(String a, String b) {
		String[] x = a.split("[.]");
		String[] y = b.split("[.]");
		for (int i = 0; i < Math.max(x.length, y.length); i++) {
			int d = Integer.compare(part(x, i), part(y, i));
			if (d != 0)
				return d;
		}
		return 0;
	}

	/** A version part's leading number; a missing or non-numeric part is 0. */
	private static int part(String[] parts, int i) {
		if (i >= parts.length)
			return 0;
		String digits = parts[i].replaceAll("[^0-9].*$", "");
		return digits.isEmpty() ? 0 : Integer.parseInt(digits);
	}
}
