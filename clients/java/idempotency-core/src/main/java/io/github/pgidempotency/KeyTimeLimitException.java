package io.github.pgidempotency;

/**
 * The key's transaction ran past its time limit ({@link KeyRunner.Policy#timeLimit()}):
 * {@link KeyRunner} ended its connection, so the server rolled it back and
 * freed the key; nothing of it was kept.
 */
public final class KeyTimeLimitException extends IdempotencyException {
	private static final long serialVersionUID = 1L;

	/** The exception, with its code's detail. */
	public KeyTimeLimitException() {
		super(ProblemCode.TIME_LIMIT);
	}
}
