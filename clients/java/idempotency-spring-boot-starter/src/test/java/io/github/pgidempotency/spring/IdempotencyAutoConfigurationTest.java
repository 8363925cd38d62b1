package io.github.pgidempotency.spring;

import static org.assertj.core.api.Assertions.assertThat;

import io.github.pgidempotency.IdempotencyEngine;
import io.github.pgidempotency.IdempotencySettings;
import io.github.pgidempotency.ProblemCode;
import io.github.pgidempotency.servlet.ScopeResolver;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.autoconfigure.http.HttpMessageConvertersAutoConfiguration;
import org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration;
import org.springframework.boot.autoconfigure.jdbc.DataSourceTransactionManagerAutoConfiguration;
import org.springframework.boot.autoconfigure.web.servlet.DispatcherServletAutoConfiguration;
import org.springframework.boot.autoconfigure.web.servlet.WebMvcAutoConfiguration;
import org.springframework.boot.test.context.runner.WebApplicationContextRunner;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RestController;

/** Start-up: the beans, their back-off, the properties, the scope and version checks. */
class IdempotencyAutoConfigurationTest {
	static final String URL = IdempotentMockMvcTest.URL;

	static String sibling(String suffix) {
		int q = URL.indexOf('?');
		return URL.substring(0, q < 0 ? URL.length() : q) + suffix + (q < 0 ? "" : URL.substring(q));
	}

	final WebApplicationContextRunner runner = new WebApplicationContextRunner()
		.withConfiguration(AutoConfigurations.of(DataSourceAutoConfiguration.class,
			DataSourceTransactionManagerAutoConfiguration.class, DispatcherServletAutoConfiguration.class,
			HttpMessageConvertersAutoConfiguration.class, WebMvcAutoConfiguration.class,
			IdempotencyAutoConfiguration.class))
		.withPropertyValues("spring.datasource.url=" + URL);

	@RestController
	static class Payments {
		@PostMapping("/payments")
		@Idempotent
		String create() {
			return "ok";
		}
	}

	@Configuration
	static class WithScope {
		@Bean
		ScopeResolver scope() {
			return request -> "acct";
		}
	}

	@Configuration
	static class OwnSettings {
		@Bean
		IdempotencySettings settings() {
			return IdempotencySettings.builder().retryAfterSeconds(9).build();
		}
	}

	@Test
	void beansAndProperties() {
		runner.withUserConfiguration(WithScope.class, Payments.class)
			.withPropertyValues("idempotency.mapping.in-progress.status=429", "idempotency.retry-after=3",
				"idempotency.replay-headers=Content-Type,Location,ETag", "idempotency.retryable-statuses=5xx",
				"idempotency.ttl=2h", "idempotency.sql-states.57014=retry")
			.run(ctx -> {
				assertThat(ctx).hasNotFailed();
				assertThat(ctx).hasSingleBean(IdempotencyEngine.class).hasSingleBean(FilterRegistrationBean.class);
				IdempotencySettings s = ctx.getBean(IdempotencySettings.class);
				assertThat(s.mapping().entry(ProblemCode.IN_PROGRESS).status()).isEqualTo(429);
				assertThat(s.mapping().entry(ProblemCode.IN_PROGRESS).retryAfter()).isTrue();
				assertThat(s.retryAfterSeconds()).isEqualTo(3);
				assertThat(s.replayHeaders()).containsExactlyInAnyOrder("content-type", "location", "etag");
				assertThat(s.retryableStatuses().contains(503)).isTrue();
				assertThat(s.retryableStatuses().contains(429)).isFalse();
				assertThat(s.ttl()).hasHours(2);
				assertThat(s.mapping().forSqlState("57014")).isEqualTo(ProblemCode.RETRY);
				assertThat(ctx.getBean(IdempotencyVersionCheck.class).version()).isNotNull();
			});
	}

	@Test
	void userBeansWin() {
		runner.withUserConfiguration(WithScope.class, OwnSettings.class).run(ctx -> {
			assertThat(ctx).hasNotFailed();
			assertThat(ctx.getBean(IdempotencySettings.class).retryAfterSeconds()).isEqualTo(9);
			assertThat(ctx.getBean(IdempotencyEngine.class).settings().retryAfterSeconds()).isEqualTo(9);
		});
	}

	@Test
	void annotatedRouteWithoutScopeFailsAtStartUp() {
		runner.withUserConfiguration(Payments.class).run(ctx -> assertThat(ctx).hasFailed()
			.getFailure().hasStackTraceContaining("no ScopeResolver bean"));
	}

	@Test
	void missingOrOldExtensionFailsAtStartUp() {
		runner.withUserConfiguration(WithScope.class)
			.withPropertyValues("spring.datasource.url=" + sibling("_noext"))
			.run(ctx -> assertThat(ctx).hasFailed().getFailure()
				.hasStackTraceContaining("the idempotency extension is not installed"));
		runner.withUserConfiguration(WithScope.class)
			.withPropertyValues("spring.datasource.url=" + sibling("_old"))
			.run(ctx -> assertThat(ctx).hasFailed().getFailure()
				.hasStackTraceContaining("is version 0.1.0, older than 0.2.0"));
	}

	@Configuration
	static class FinalByPredicate {
		@Bean
		IdempotencySettingsCustomizer finalIllegalState() {
			return settings -> settings.finalErrors(e -> e instanceof IllegalStateException);
		}
	}

	@Test
	void finalErrorsFromThePropertyAndCustomizers() {
		runner.withUserConfiguration(WithScope.class, FinalByPredicate.class)
			.withPropertyValues("idempotency.final-errors=java.lang.IllegalArgumentException")
			.run(ctx -> {
				assertThat(ctx).hasNotFailed();
				assertThat(ctx).hasSingleBean(RaisedErrorRecorder.class);
				IdempotencySettings s = ctx.getBean(IdempotencySettings.class);
				assertThat(s.isFinalError(new NumberFormatException())).isTrue();
				assertThat(s.isFinalError(new IllegalStateException())).isTrue();
				assertThat(s.isFinalError(new RuntimeException())).isFalse();
			});
		runner.withUserConfiguration(WithScope.class)
			.withPropertyValues("idempotency.final-errors=com.example.NoSuchException")
			.run(ctx -> assertThat(ctx).hasFailed().getFailure()
				.hasStackTraceContaining("idempotency.final-errors: no class com.example.NoSuchException"));
		runner.withUserConfiguration(WithScope.class)
			.withPropertyValues("idempotency.final-errors=java.lang.String")
			.run(ctx -> assertThat(ctx).hasFailed().getFailure()
				.hasStackTraceContaining("java.lang.String is not an exception"));
	}

	@Test
	void disabled() {
		runner.withUserConfiguration(WithScope.class).withPropertyValues("idempotency.enabled=false")
			.run(ctx -> assertThat(ctx).doesNotHaveBean(IdempotencyEngine.class));
	}
}
