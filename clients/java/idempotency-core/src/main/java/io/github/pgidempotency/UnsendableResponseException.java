package io.github.pgidempotency;

/**
 * A handler's response that its server could not write as it is, or that
 * PostgreSQL could not store unchanged (doc/clients.md, "Only what can be
 * sent is committed"): the engine rolls the transaction back and answers 500
 * {@code internal-error}, so that no record is committed with an answer that
 * would never reach a client.
 */
public final class UnsendableResponseException extends RuntimeException {
	private static final long serialVersionUID = 1L;

	/**
	 * An exception.
	 *
	 * @param message what cannot be sent or stored
	 */
	public UnsendableResponseException(String message) {
		super(message);
	}
}
