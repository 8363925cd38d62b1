package io.github.pgidempotency;

import java.util.Objects;

/**
 * A handler raised an error and its framework resolved it to a response (a
 * Spring {@code ResponseStatusException} answered 402, an
 * {@code @ExceptionHandler}'s answer): what a framework integration throws
 * from its {@link IdempotencyEngine.Handler} so that the engine knows the
 * handler did not return. The engine rolls it back and answers the resolved
 * response, or, where the settings' {@linkplain IdempotencySettings#isFinalError
 * final errors} take the cause, completes it with that response like a
 * returned one.
 */
public final class RaisedError extends Exception {
	private static final long serialVersionUID = 1L;

	/** The resolved response: not serialized with the error. */
	private final transient CapturedResponse resolved;

	/**
	 * An error and its resolved response.
	 *
	 * @param cause what the handler raised
	 * @param resolved the response its framework resolved it to
	 */
	public RaisedError(Throwable cause, CapturedResponse resolved) {
		super("the handler raised " + Objects.requireNonNull(cause).getClass().getName(), cause, false, false);
		this.resolved = Objects.requireNonNull(resolved);
	}

	/** @return the response the framework resolved the error to */
	public CapturedResponse resolved() {
		return resolved;
	}
}
