package io.github.pgidempotency;

import java.util.Collections;
import java.util.EnumMap;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * doc/clients.md's mapping table as data: for each {@link ProblemCode} its
 * HTTP status and whether it sends {@code Retry-After}, and the SQLSTATEs
 * that map to a code. Immutable; change it with {@link #toBuilder()}.
 *
 * <pre>{@code
 * ProblemMapping mapping = ProblemMapping.defaults().toBuilder()
 *     .status(ProblemCode.IN_PROGRESS, 429)
 *     .sqlState("57014", ProblemCode.RETRY)
 *     .build();
 * }</pre>
 */
public final class ProblemMapping {
	/**
	 * One row of the table.
	 *
	 * @param status the HTTP status of the case
	 * @param retryAfter whether the answer has a {@code Retry-After} header
	 */
	public record Entry(int status, boolean retryAfter) {
		/**
		 * A row.
		 *
		 * @param status an HTTP status, 100 to 599
		 * @param retryAfter whether the answer has a {@code Retry-After} header
		 */
		public Entry {
			if (status < 100 || status > 599)
				throw new IllegalArgumentException("HTTP status " + status + " is outside 100 to 599");
		}
	}

	private static final ProblemMapping DEFAULTS = new Builder()
		.entry(ProblemCode.MISSING_KEY, 400, false)
		.entry(ProblemCode.INVALID_KEY, 400, false)
		.entry(ProblemCode.UNAUTHENTICATED, 401, false)
		.entry(ProblemCode.INVALID_REQUEST, 400, false)
		.entry(ProblemCode.PAYLOAD_TOO_LARGE, 413, false)
		.entry(ProblemCode.IN_PROGRESS, 409, true)
		.entry(ProblemCode.STUCK, 409, true)
		.entry(ProblemCode.MISMATCH, 422, false)
		.entry(ProblemCode.READ_ONLY, 503, true)
		.entry(ProblemCode.RETRY, 503, true)
		.entry(ProblemCode.UNAVAILABLE, 503, true)
		.entry(ProblemCode.TIME_LIMIT, 503, true)
		.entry(ProblemCode.UNSUPPORTED_ENVELOPE, 500, false)
		.entry(ProblemCode.INTERNAL_ERROR, 500, false)
		.sqlState("22023", ProblemCode.INVALID_REQUEST)
		// the server refusing the request document or the key as it reads
		// them (doc/clients.md, "Requests the server refuses")
		.sqlState("22P02", ProblemCode.INVALID_REQUEST)
		.sqlState("22P05", ProblemCode.INVALID_REQUEST)
		.sqlState("22003", ProblemCode.INVALID_REQUEST)
		.sqlState("22021", ProblemCode.INVALID_REQUEST)
		.sqlState("54001", ProblemCode.INVALID_REQUEST)
		.sqlState("ID003", ProblemCode.IN_PROGRESS)
		.sqlState("ID004", ProblemCode.MISMATCH)
		.sqlState("ID005", ProblemCode.STUCK)
		.sqlState("25006", ProblemCode.READ_ONLY)
		.sqlState("40001", ProblemCode.RETRY)
		.sqlState("40P01", ProblemCode.RETRY)
		// the database going away: refused, lost, shutting down, starting up
		.sqlState("08000", ProblemCode.UNAVAILABLE)
		.sqlState("08001", ProblemCode.UNAVAILABLE)
		.sqlState("08003", ProblemCode.UNAVAILABLE)
		.sqlState("08004", ProblemCode.UNAVAILABLE)
		.sqlState("08006", ProblemCode.UNAVAILABLE)
		.sqlState("08007", ProblemCode.UNAVAILABLE)
		.sqlState("57P01", ProblemCode.UNAVAILABLE)
		.sqlState("57P02", ProblemCode.UNAVAILABLE)
		.sqlState("57P03", ProblemCode.UNAVAILABLE)
		.build();

	private final Map<ProblemCode, Entry> entries;
	private final Map<String, ProblemCode> sqlStates;

	private ProblemMapping(Builder b) {
		for (ProblemCode c : ProblemCode.values())
			if (!b.entries.containsKey(c))
				throw new IllegalArgumentException("the mapping has no entry for \"" + c.code() + "\"");
		this.entries = Collections.unmodifiableMap(new EnumMap<>(b.entries));
		this.sqlStates = Collections.unmodifiableMap(new LinkedHashMap<>(b.sqlStates));
	}

	/** @return doc/clients.md's table */
	public static ProblemMapping defaults() {
		return DEFAULTS;
	}

	/**
	 * The row of a case.
	 *
	 * @param code the case
	 * @return its status and {@code Retry-After}
	 */
	public Entry entry(ProblemCode code) {
		return entries.get(code);
	}

	/** @return every row, by case */
	public Map<ProblemCode, Entry> entries() {
		return entries;
	}

	/**
	 * The case of an SQLSTATE.
	 *
	 * @param sqlState a five-character SQLSTATE, or {@code null}
	 * @return its case, or {@link ProblemCode#INTERNAL_ERROR} for any other
	 */
	public ProblemCode forSqlState(String sqlState) {
		ProblemCode c = sqlState == null ? null : sqlStates.get(sqlState);
		return c == null ? ProblemCode.INTERNAL_ERROR : c;
	}

	/** @return the SQLSTATEs that map to a case of their own */
	public Map<String, ProblemCode> sqlStates() {
		return sqlStates;
	}

	/**
	 * The answer for a case.
	 *
	 * @param code the case
	 * @param detail the detail sentence, or {@code null} for the case's default
	 * @param retryAfterSeconds the {@code Retry-After} of the cases that have one
	 * @return the problem
	 */
	public Problem problem(ProblemCode code, String detail, int retryAfterSeconds) {
		Entry e = entries.get(code);
		return new Problem(code, e.status(), detail != null ? detail : code.defaultDetail(),
			e.retryAfter() ? retryAfterSeconds : null);
	}

	/** @return a builder holding this mapping */
	public Builder toBuilder() {
		Builder b = new Builder();
		b.entries.putAll(entries);
		b.sqlStates.putAll(sqlStates);
		return b;
	}

	/** Builds a {@link ProblemMapping}. */
	public static final class Builder {
		private final Map<ProblemCode, Entry> entries = new EnumMap<>(ProblemCode.class);
		private final Map<String, ProblemCode> sqlStates = new LinkedHashMap<>();

		private Builder() {
		}

		/**
		 * Sets a row.
		 *
		 * @param code the case
		 * @param status its HTTP status
		 * @param retryAfter whether it sends {@code Retry-After}
		 * @return this builder
		 */
		public Builder entry(ProblemCode code, int status, boolean retryAfter) {
			entries.put(code, new Entry(status, retryAfter));
			return this;
		}

		/**
		 * Sets the status of a row, keeping its {@code Retry-After}.
		 *
		 * @param code the case
		 * @param status its HTTP status
		 * @return this builder
		 */
		public Builder status(ProblemCode code, int status) {
			Entry e = entries.get(code);
			return entry(code, status, e != null && e.retryAfter());
		}

		/**
		 * Maps an SQLSTATE to a case.
		 *
		 * @param sqlState a five-character SQLSTATE
		 * @param code its case
		 * @return this builder
		 */
		public Builder sqlState(String sqlState, ProblemCode code) {
			if (sqlState == null || sqlState.length() != 5)
				throw new IllegalArgumentException("\"" + sqlState + "\" is not a five-character SQLSTATE");
			sqlStates.put(sqlState, code);
			return this;
		}

		/** @return the mapping */
		public ProblemMapping build() {
			return new ProblemMapping(this);
		}
	}
}
