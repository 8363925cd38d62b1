/**
 * A jakarta.servlet {@link jakarta.servlet.Filter} for the {@code idempotency}
 * extension: {@link io.github.pgidempotency.servlet.IdempotencyFilter} reads the
 * request, reserves the key, runs the rest of the chain inside the key's
 * transaction with the response buffered, completes, commits, and only then
 * writes the response.
 */
package io.github.pgidempotency.servlet;
