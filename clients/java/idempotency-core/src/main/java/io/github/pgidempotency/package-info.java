/**
 * The Idempotency-Key behaviour of doc/clients.md on JDBC, for the
 * {@code idempotency} PostgreSQL extension.
 *
 * <p>{@link io.github.pgidempotency.IdempotencyEngine} does one request: it
 * parses the key ({@link io.github.pgidempotency.IdempotencyKeys}), builds the
 * fingerprint document ({@link io.github.pgidempotency.RequestDocument}),
 * reserves the key, runs the handler on the same {@link java.sql.Connection}
 * in the same transaction, stores the answer as a versioned
 * {@link io.github.pgidempotency.ResponseEnvelope} and commits, all through a
 * {@link io.github.pgidempotency.TransactionRunner}. Every other outcome and
 * error is answered by the {@link io.github.pgidempotency.ProblemMapping}, which
 * is data the application can change. {@link io.github.pgidempotency.VersionCheck}
 * refuses an extension older than 0.2.0.
 *
 * <p>The framework integrations (the servlet {@code IdempotencyFilter}, the
 * Spring Boot starter) are thin layers over this package.
 */
package io.github.pgidempotency;
