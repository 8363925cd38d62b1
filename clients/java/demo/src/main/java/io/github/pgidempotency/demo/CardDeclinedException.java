package io.github.pgidempotency.demo;

/**
 * The card was declined: a final error ({@code idempotency.final-errors} in
 * application.properties), so the declined payment row and its 402 answer
 * are committed and replayed, where any other exception would be rolled back.
 */
public class CardDeclinedException extends RuntimeException {
	private static final long serialVersionUID = 1L;

	/** The exception. */
	public CardDeclinedException() {
		super("the card was declined");
	}
}
