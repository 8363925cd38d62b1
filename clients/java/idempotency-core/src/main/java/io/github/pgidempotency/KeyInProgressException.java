package io.github.pgidempotency;

/**
 * Another transaction holds the key now (idem_reserve's in_progress). {@link KeyRunner} raises it after
 * ROLLBACK; the function was not called.
 */
public final class KeyInProgressException extends IdempotencyException {
	private static final long serialVersionUID = 1L;

	/** The exception, with its code's detail. */
	public KeyInProgressException() {
		super(ProblemCode.IN_PROGRESS);
	}
}
