/**
 * Spring Boot integration of the {@code idempotency} extension: mark a
 * controller method {@link io.github.pgidempotency.spring.Idempotent}, supply an
 * {@link io.github.pgidempotency.servlet.ScopeResolver} bean, and the method runs
 * inside the key's transaction, the one Spring's
 * {@link org.springframework.transaction.PlatformTransactionManager} manages, so
 * its {@code JdbcTemplate} and {@code @Transactional} work and the key commit
 * together. Settings are {@code idempotency.*} properties
 * ({@link io.github.pgidempotency.spring.IdempotencyProperties}); every bean of
 * {@link io.github.pgidempotency.spring.IdempotencyAutoConfiguration} can be
 * replaced.
 */
package io.github.pgidempotency.spring;
