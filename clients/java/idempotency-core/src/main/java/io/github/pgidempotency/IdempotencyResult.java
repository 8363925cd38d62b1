package io.github.pgidempotency;

/**
 * What {@link IdempotencyEngine#execute} decided; the framework integration
 * writes it to the client.
 */
public sealed interface IdempotencyResult {
	/** @return the HTTP status the client gets */
	int status();

	/**
	 * The handler ran: its response goes to the client as it is.
	 *
	 * @param response the handler's response
	 * @param completed whether its record was completed and committed
	 *        (false: rolled back for a retryable status, or no key on a route
	 *        whose key is optional)
	 */
	record Handled(CapturedResponse response, boolean completed) implements IdempotencyResult {
		@Override
		public int status() {
			return response.status();
		}
	}

	/**
	 * A replay: the stored answer, sent with {@code Idempotent-Replayed: true}.
	 *
	 * @param response the stored answer
	 */
	record Replayed(StoredResponse response) implements IdempotencyResult {
		/** The header a replay carries. */
		public static final String HEADER = "Idempotent-Replayed";

		@Override
		public int status() {
			return response.status();
		}
	}

	/**
	 * A problem answer; nothing was kept.
	 *
	 * @param problem the problem
	 * @param cause the error behind it, or {@code null}
	 */
	record Refused(Problem problem, Throwable cause) implements IdempotencyResult {
		@Override
		public int status() {
			return problem.status();
		}
	}
}
