package io.github.pgidempotency;

/**
 * A request the library refuses before or instead of running the handler
 * (a bad key, no principal, a subset on a non-JSON body, an unknown
 * envelope): the {@link ProblemMapping} turns it into its answer.
 */
public class IdempotencyException extends RuntimeException {
	/** The serialization version. */
	private static final long serialVersionUID = 1L;

	/** The case. */
	private final ProblemCode code;

	/**
	 * A refusal with the code's default detail.
	 *
	 * @param code the case
	 */
	public IdempotencyException(ProblemCode code) {
		this(code, code.defaultDetail());
	}

	/**
	 * A refusal with a detail sentence of its own.
	 *
	 * @param code the case
	 * @param detail the sentence the client is told
	 */
	public IdempotencyException(ProblemCode code, String detail) {
		super(detail);
		this.code = code;
	}

	/** @return the case */
	public ProblemCode code() {
		return code;
	}
}
