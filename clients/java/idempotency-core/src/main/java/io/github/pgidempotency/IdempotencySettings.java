package io.github.pgidempotency;

import java.time.Duration;
import java.util.Collection;
import java.util.LinkedHashSet;
import java.util.Locale;
import java.util.Set;
import java.util.function.Predicate;

/**
 * The settings every library has (doc/clients.md, "Settings every library
 * has"), immutable; the per-route ones ({@link Route}) override the
 * defaults held here. The scope function belongs to the framework
 * integration and has no default.
 *
 * <pre>{@code
 * IdempotencySettings settings = IdempotencySettings.builder()
 *     .ttl(Duration.ofHours(24))
 *     .replayHeaders("content-type", "location", "etag")
 *     .finalErrors(CardDeclinedException.class)
 *     .build();
 * }</pre>
 */
public final class IdempotencySettings {
	private final Duration ttl;
	private final boolean keyRequired;
	private final Set<String> replayHeaders;
	private final StatusSet retryableStatuses;
	private final ProblemMapping mapping;
	private final int retryAfterSeconds;
	private final Predicate<Throwable> finalErrors;
	private final Duration timeLimit;
	private final long maxRequestBody;
	private final long maxStoredResponse;

	private IdempotencySettings(Builder b) {
		this.ttl = checkTtl(b.ttl);
		this.keyRequired = b.keyRequired;
		this.replayHeaders = Set.copyOf(b.replayHeaders);
		this.retryableStatuses = b.retryableStatuses;
		this.mapping = b.mapping;
		if (b.retryAfterSeconds < 0)
			throw new IllegalArgumentException("retry-after must be 0 seconds or more");
		this.retryAfterSeconds = b.retryAfterSeconds;
		this.finalErrors = b.finalErrors;
		if (b.timeLimit != null && (b.timeLimit.isNegative() || b.timeLimit.isZero()))
			throw new IllegalArgumentException("time-limit must be positive, not " + b.timeLimit);
		this.timeLimit = b.timeLimit;
		if (b.maxRequestBody < 0 || b.maxStoredResponse < 0)
			throw new IllegalArgumentException("a size limit must be 0 bytes or more");
		this.maxRequestBody = b.maxRequestBody;
		this.maxStoredResponse = b.maxStoredResponse;
	}

	/** @return the defaults */
	public static IdempotencySettings defaults() {
		return builder().build();
	}

	/** @return a builder holding the defaults */
	public static Builder builder() {
		return new Builder();
	}

	/** @return a builder holding these settings */
	public Builder toBuilder() {
		Builder b = new Builder();
		b.ttl = ttl;
		b.keyRequired = keyRequired;
		b.replayHeaders.clear();
		b.replayHeaders.addAll(replayHeaders);
		b.retryableStatuses = retryableStatuses;
		b.mapping = mapping;
		b.retryAfterSeconds = retryAfterSeconds;
		b.finalErrors = finalErrors;
		b.timeLimit = timeLimit;
		b.maxRequestBody = maxRequestBody;
		b.maxStoredResponse = maxStoredResponse;
		return b;
	}

	/** @return the default ttl, or {@code null} for the server's {@code idempotency.default_ttl} */
	public Duration ttl() {
		return ttl;
	}

	/** @return whether a missing key is 400 by default */
	public boolean keyRequired() {
		return keyRequired;
	}

	/** @return the lower-case names of the headers stored and replayed */
	public Set<String> replayHeaders() {
		return replayHeaders;
	}

	/** @return the handler statuses that roll back instead of completing */
	public StatusSet retryableStatuses() {
		return retryableStatuses;
	}

	/** @return the status and {@code Retry-After} of each case */
	public ProblemMapping mapping() {
		return mapping;
	}

	/** @return the {@code Retry-After} seconds of the cases that have one */
	public int retryAfterSeconds() {
		return retryAfterSeconds;
	}

	/**
	 * Whether a raised error is final: completed with the response its
	 * framework resolved it to, instead of rolled back.
	 *
	 * @param error what the handler raised
	 * @return whether one of the final error types or predicates takes it
	 */
	public boolean isFinalError(Throwable error) {
		return error != null && finalErrors.test(error);
	}

	/** @return how long the key's transaction may run, or {@code null} for no limit */
	public Duration timeLimit() {
		return timeLimit;
	}

	/** @return the largest request body taken, in bytes (over it: 413 {@code payload-too-large}) */
	public long maxRequestBody() {
		return maxRequestBody;
	}

	/**
	 * @return the largest stored response (the envelope), in bytes, over which
	 *         the request is rolled back (500); {@link Long#MAX_VALUE} for no limit
	 */
	public long maxStoredResponse() {
		return maxStoredResponse;
	}

	/** A ttl must be positive; null is the server's default. */
	static Duration checkTtl(Duration ttl) {
		if (ttl != null && (ttl.isNegative() || ttl.isZero()))
			throw new IllegalArgumentException("ttl must be positive, not " + ttl);
		return ttl;
	}

	/** Builds {@link IdempotencySettings}. */
	public static final class Builder {
		private Duration ttl;
		private boolean keyRequired = true;
		private final Set<String> replayHeaders = new LinkedHashSet<>(ResponseEnvelope.defaultReplayHeaders());
		private StatusSet retryableStatuses = StatusSet.defaultRetryable();
		private ProblemMapping mapping = ProblemMapping.defaults();
		private int retryAfterSeconds = 1;
		private Predicate<Throwable> finalErrors = error -> false;
		private Duration timeLimit;
		private long maxRequestBody = 1024 * 1024;
		private long maxStoredResponse = Long.MAX_VALUE;

		private Builder() {
		}

		/**
		 * How long a completed record replays, from its completion.
		 *
		 * @param ttl a positive duration, or {@code null} for the server's default
		 * @return this builder
		 */
		public Builder ttl(Duration ttl) {
			this.ttl = ttl;
			return this;
		}

		/**
		 * Whether a missing key is 400 {@code missing-key} (the default) or runs
		 * the handler without idempotency.
		 *
		 * @param keyRequired whether the key is required
		 * @return this builder
		 */
		public Builder keyRequired(boolean keyRequired) {
			this.keyRequired = keyRequired;
			return this;
		}

		/**
		 * The allow-list of headers stored and replayed (replaces it).
		 *
		 * @param names header names, in any case
		 * @return this builder
		 */
		public Builder replayHeaders(Collection<String> names) {
			replayHeaders.clear();
			for (String n : names)
				replayHeaders.add(n.trim().toLowerCase(Locale.ROOT));
			return this;
		}

		/**
		 * The allow-list of headers stored and replayed (replaces it).
		 *
		 * @param names header names, in any case
		 * @return this builder
		 */
		public Builder replayHeaders(String... names) {
			return replayHeaders(java.util.List.of(names));
		}

		/**
		 * The handler statuses that roll back instead of completing.
		 *
		 * @param statuses the set, such as {@code StatusSet.parse("5xx, 408, 429")}
		 * @return this builder
		 */
		public Builder retryableStatuses(StatusSet statuses) {
			this.retryableStatuses = java.util.Objects.requireNonNull(statuses);
			return this;
		}

		/**
		 * The status and {@code Retry-After} of each case.
		 *
		 * @param mapping the mapping
		 * @return this builder
		 */
		public Builder mapping(ProblemMapping mapping) {
			this.mapping = java.util.Objects.requireNonNull(mapping);
			return this;
		}

		/**
		 * The {@code Retry-After} seconds of the cases that have one.
		 *
		 * @param seconds 0 or more (default 1)
		 * @return this builder
		 */
		public Builder retryAfterSeconds(int seconds) {
			this.retryAfterSeconds = seconds;
			return this;
		}

		/**
		 * Adds final errors: a raised error that is an instance of one of these
		 * types is completed with the status and body its framework resolved
		 * it to (and replayed), instead of rolled back. Its causes are not
		 * looked at.
		 *
		 * @param types error types
		 * @return this builder
		 */
		@SafeVarargs
		public final Builder finalErrors(Class<? extends Throwable>... types) {
			java.util.List<Class<? extends Throwable>> list = new java.util.ArrayList<>();
			for (Class<? extends Throwable> type : types)
				list.add(java.util.Objects.requireNonNull(type));
			return finalErrors(list);
		}

		/**
		 * Adds final errors by type (see {@link #finalErrors(Class...)}).
		 *
		 * @param types error types
		 * @return this builder
		 */
		public Builder finalErrors(Collection<Class<? extends Throwable>> types) {
			java.util.List<Class<? extends Throwable>> list = java.util.List.copyOf(types);
			return finalErrors(error -> list.stream().anyMatch(t -> t.isInstance(error)));
		}

		/**
		 * Adds final errors by a predicate of the raised error: where it (or an
		 * earlier type or predicate) says yes, the error is completed with its
		 * resolved status and body instead of rolled back.
		 *
		 * @param predicate the test
		 * @return this builder
		 */
		public Builder finalErrors(Predicate<? super Throwable> predicate) {
			java.util.Objects.requireNonNull(predicate);
			Predicate<Throwable> before = finalErrors;
			finalErrors = error -> before.test(error) || predicate.test(error);
			return this;
		}

		/**
		 * How long the key's transaction may run: past it the library ends
		 * its connection, so the server rolls it back and frees the key (a
		 * hung handler cannot hold it past {@code idempotency.processing_timeout}),
		 * and answers 503 {@code time-limit}.
		 *
		 * @param timeLimit a positive duration, or {@code null} for none (the default)
		 * @return this builder
		 */
		public Builder timeLimit(Duration timeLimit) {
			this.timeLimit = timeLimit;
			return this;
		}

		/**
		 * The largest request body an idempotent route takes: a larger one is
		 * 413 {@code payload-too-large}, before anything is reserved and
		 * without reading it whole.
		 *
		 * @param bytes 0 or more (default 1 MiB)
		 * @return this builder
		 */
		public Builder maxRequestBody(long bytes) {
			this.maxRequestBody = bytes;
			return this;
		}

		/**
		 * The largest response stored (its envelope, in bytes): a larger one is
		 * rolled back and answered 500 {@code internal-error}, before COMMIT.
		 *
		 * @param bytes 0 or more (default: no limit)
		 * @return this builder
		 */
		public Builder maxStoredResponse(long bytes) {
			this.maxStoredResponse = bytes;
			return this;
		}

		/** @return the settings */
		public IdempotencySettings build() {
			return new IdempotencySettings(this);
		}
	}
}
