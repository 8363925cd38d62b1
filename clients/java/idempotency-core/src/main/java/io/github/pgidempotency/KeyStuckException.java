package io.github.pgidempotency;

/**
 * The key's first attempt has an unknown outcome (idem_reserve's stuck). {@link KeyRunner} raises it after
 * ROLLBACK; the function was not called.
 */
public final class KeyStuckException extends IdempotencyException {
	private static final long serialVersionUID = 1L;

	/** The exception, with its code's detail. */
	public KeyStuckException() {
		super(ProblemCode.STUCK);
	}
}
