package io.github.pgidempotency.spring.app;

import java.util.Map;

import io.github.pgidempotency.servlet.ScopeResolver;
import io.github.pgidempotency.spring.IdempotencySettingsCustomizer;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;

/** The application of the MockMvc tests. */
@SpringBootApplication
public class TestApplication {
	static final Map<String, String> TOKENS = Map.of("token-a", "acct-a", "token-b", "acct-b");

	/** A final error by a predicate, in code. */
	@Bean
	IdempotencySettingsCustomizer finalAnnotated() {
		return settings -> settings.finalErrors(e -> e instanceof RaisingController.FinalAnnotated);
	}

	/** The account of the bearer token. */
	@Bean
	ScopeResolver scopeResolver() {
		return request -> {
			String auth = request.getHeader("Authorization");
			return auth != null && auth.startsWith("Bearer ") ? TOKENS.get(auth.substring(7)) : null;
		};
	}
}
