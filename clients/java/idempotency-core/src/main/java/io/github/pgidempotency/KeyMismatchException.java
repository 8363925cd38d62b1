package io.github.pgidempotency;

/**
 * The key was used before with another request (idem_reserve's mismatch). {@link KeyRunner} raises it after
 * ROLLBACK; the function was not called.
 */
public final class KeyMismatchException extends IdempotencyException {
	private static final long serialVersionUID = 1L;

	/** The exception, with its code's detail. */
	public KeyMismatchException() {
		super(ProblemCode.MISMATCH);
	}
}
