package io.github.pgidempotency.spring;

import io.github.pgidempotency.IdempotencySettings;

/**
 * Changes the settings the {@code idempotency.*} properties made, in code:
 * the auto-configuration applies every such bean, in order, before it builds
 * the {@link IdempotencySettings}.
 *
 * <pre>{@code
 * @Bean
 * IdempotencySettingsCustomizer finalDeclines() {
 *     return settings -> settings.finalErrors(e -> e instanceof ResponseStatusException r
 *         && r.getStatusCode().value() == 402);
 * }
 * }</pre>
 */
@FunctionalInterface
public interface IdempotencySettingsCustomizer {
	/**
	 * Changes the settings.
	 *
	 * @param settings a builder holding the properties' settings
	 */
	void customize(IdempotencySettings.Builder settings);
}
