package io.github.pgidempotency;

/**
 * The cases the library answers itself, with an RFC 9457 problem document
 * ({@code application/problem+json}); doc/clients.md, "The mapping, as data".
 * Each has a stable {@link #code()}, the anchor of its {@link #type()}, a
 * title and a default detail sentence.
 */
public enum ProblemCode {
	/** No {@code Idempotency-Key} on a route that requires one. */
	MISSING_KEY("missing-key", "Idempotency-Key missing",
		"This request requires an Idempotency-Key header."),
	/** A malformed key, or more than one {@code Idempotency-Key} field. */
	INVALID_KEY("invalid-key", "Invalid Idempotency-Key",
		"The Idempotency-Key header must be one string of printable ASCII characters."),
	/** The scope function found no principal. */
	UNAUTHENTICATED("unauthenticated", "Unauthenticated",
		"The request has no authenticated principal."),
	/** SQLSTATE 22023 (a bad argument), or a fingerprint subset on a non-JSON body. */
	INVALID_REQUEST("invalid-request", "Invalid request",
		"The request was refused as invalid."),
	/** A request body over the library's limit ({@link IdempotencySettings#maxRequestBody()}). */
	PAYLOAD_TOO_LARGE("payload-too-large", "Payload too large",
		"The request body is over the limit this service takes."),
	/** Outcome {@code in_progress} (SQLSTATE ID003). */
	IN_PROGRESS("in-progress", "Request in progress",
		"A request with this Idempotency-Key is still being processed."),
	/** Outcome {@code stuck} (SQLSTATE ID005). */
	STUCK("stuck", "Request stuck",
		"An earlier request with this Idempotency-Key did not finish; its outcome is being checked."),
	/** Outcome {@code mismatch} (SQLSTATE ID004). */
	MISMATCH("mismatch", "Idempotency-Key reused",
		"This Idempotency-Key was already used with another request."),
	/** SQLSTATE 25006: the database is read-only (a standby). */
	READ_ONLY("read-only", "Database read-only",
		"The database is read-only at the moment; retry later."),
	/** SQLSTATE 40001 or 40P01: a serialization failure or a deadlock. */
	RETRY("retry", "Retry the request",
		"The request conflicted with another one and was rolled back; retry it."),
	/**
	 * The database cannot be reached: connection refused or lost (SQLSTATE
	 * class 08, 57P01 to 57P03), or no pooled connection in time.
	 */
	UNAVAILABLE("unavailable", "Database unavailable",
		"The database cannot be reached at the moment; retry later."),
	/** The key's transaction ran past the time limit: rolled back, the key freed. */
	TIME_LIMIT("time-limit", "Request took too long",
		"The request ran past its time limit and nothing of it was kept; retry it."),
	/** A stored envelope of a version this library does not know. */
	UNSUPPORTED_ENVELOPE("unsupported-envelope", "Unsupported response envelope",
		"The stored response was written by a newer version of the library."),
	/** Any other error: the transaction was rolled back. */
	INTERNAL_ERROR("internal-error", "Internal error",
		"The request failed and nothing of it was kept.");

	/** The base of every problem {@code type}: doc/clients.md's anchors. */
	public static final String TYPE_BASE =
		"https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md#";

	private final String code;
	private final String title;
	private final String detail;

	ProblemCode(String code, String title, String detail) {
		this.code = code;
		this.title = title;
		this.detail = detail;
	}

	/** @return the problem's {@code code} member, such as {@code in-progress} */
	public String code() {
		return code;
	}

	/** @return the problem's {@code type} URI */
	public String type() {
		return TYPE_BASE + code;
	}

	/** @return the problem's {@code title} */
	public String title() {
		return title;
	}

	/** @return the default {@code detail} sentence */
	public String defaultDetail() {
		return detail;
	}

	/**
	 * The constant of a code.
	 *
	 * @param code a code such as {@code in-progress}
	 * @return its constant
	 * @throws IllegalArgumentException for an unknown code
	 */
	public static ProblemCode of(String code) {
		for (ProblemCode c : values())
			if (c.code.equals(code))
				return c;
		throw new IllegalArgumentException("unknown problem code \"" + code + "\"");
	}
}
