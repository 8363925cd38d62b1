package io.github.pgidempotency.spring;

import javax.sql.DataSource;

import io.github.pgidempotency.IdempotencyEngine;
import io.github.pgidempotency.IdempotencySettings;
import io.github.pgidempotency.TransactionRunner;
import io.github.pgidempotency.servlet.IdempotencyFilter;
import io.github.pgidempotency.servlet.RouteResolver;
import io.github.pgidempotency.servlet.ScopeResolver;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnSingleCandidate;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration;
import org.springframework.boot.autoconfigure.jdbc.DataSourceTransactionManagerAutoConfiguration;
import org.springframework.boot.autoconfigure.web.servlet.WebMvcAutoConfiguration;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.web.servlet.DispatcherServlet;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;

/**
 * Auto-configuration of {@link Idempotent} routes on a servlet web
 * application with one {@link DataSource} and a
 * {@link PlatformTransactionManager}. Every bean backs off where the
 * application defines its own; the application must define a
 * {@link ScopeResolver}.
 */
@AutoConfiguration(after = {DataSourceAutoConfiguration.class, DataSourceTransactionManagerAutoConfiguration.class,
	WebMvcAutoConfiguration.class})
@ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
@ConditionalOnClass({DataSource.class, PlatformTransactionManager.class, DispatcherServlet.class,
	IdempotencyFilter.class})
@ConditionalOnSingleCandidate(DataSource.class)
@ConditionalOnProperty(prefix = "idempotency", name = "enabled", matchIfMissing = true)
@EnableConfigurationProperties(IdempotencyProperties.class)
public class IdempotencyAutoConfiguration {
	/** The auto-configuration; its beans are made by Spring. */
	public IdempotencyAutoConfiguration() {
	}

	/**
	 * The settings, from the {@code idempotency.*} properties and the
	 * {@link IdempotencySettingsCustomizer} beans.
	 *
	 * @param properties the properties
	 * @param customizers the customizers, applied in order
	 * @return the settings
	 */
	@Bean
	@ConditionalOnMissingBean
	public IdempotencySettings idempotencySettings(IdempotencyProperties properties,
		ObjectProvider<IdempotencySettingsCustomizer> customizers) {
		IdempotencySettings.Builder settings = properties.toSettingsBuilder();
		customizers.orderedStream().forEach(c -> c.customize(settings));
		return settings.build();
	}

	/**
	 * Tells the filter which requests' handlers raised, whatever status
	 * Spring MVC resolves their exception to.
	 *
	 * @return the exception resolver (it resolves nothing)
	 */
	@Bean
	@ConditionalOnMissingBean
	public RaisedErrorRecorder idempotencyRaisedErrorRecorder() {
		return new RaisedErrorRecorder();
	}

	/**
	 * The key's transactions, through Spring's transaction manager.
	 *
	 * @param transactionManager the application's transaction manager
	 * @param dataSource the application's data source
	 * @return the runner
	 */
	@Bean
	@ConditionalOnMissingBean
	@ConditionalOnSingleCandidate(PlatformTransactionManager.class)
	public TransactionRunner idempotencyTransactionRunner(PlatformTransactionManager transactionManager,
		DataSource dataSource) {
		return new SpringTransactionRunner(transactionManager, dataSource);
	}

	/**
	 * The engine.
	 *
	 * @param settings the settings
	 * @param runner the transactions
	 * @return the engine
	 */
	@Bean
	@ConditionalOnMissingBean
	public IdempotencyEngine idempotencyEngine(IdempotencySettings settings, TransactionRunner runner) {
		return new IdempotencyEngine(settings, runner);
	}

	/**
	 * The routes: the {@link Idempotent} controller methods.
	 *
	 * @param mappings Spring MVC's handler mappings
	 * @param scope the scope function
	 * @return the resolver
	 */
	@Bean
	@ConditionalOnMissingBean
	public RouteResolver idempotencyRouteResolver(ObjectProvider<RequestMappingHandlerMapping> mappings,
		ObjectProvider<ScopeResolver> scope) {
		return new AnnotatedRouteResolver(mappings, scope);
	}

	/**
	 * The start-up version check.
	 *
	 * @param dataSource the application's data source
	 * @param properties {@code idempotency.check-version}
	 * @return the check, done when the bean is created
	 */
	@Bean
	@ConditionalOnMissingBean
	public IdempotencyVersionCheck idempotencyVersionCheck(DataSource dataSource, IdempotencyProperties properties) {
		return new IdempotencyVersionCheck(dataSource, properties.isCheckVersion());
	}

	/**
	 * The servlet filter.
	 *
	 * @param engine the engine
	 * @param routes the routes
	 * @param scope the scope function (checked at start-up by the route resolver)
	 * @param properties {@code idempotency.filter-order}
	 * @param versionCheck done before the filter serves
	 * @return its registration
	 */
	@Bean
	@ConditionalOnMissingBean(name = "idempotencyFilter")
	public FilterRegistrationBean<IdempotencyFilter> idempotencyFilter(IdempotencyEngine engine, RouteResolver routes,
		ObjectProvider<ScopeResolver> scope, IdempotencyProperties properties, IdempotencyVersionCheck versionCheck) {
		ScopeResolver lazy = request -> {
			ScopeResolver s = scope.getIfAvailable();
			if (s == null)
				throw new IllegalStateException("no ScopeResolver bean");
			return s.resolve(request);
		};
		FilterRegistrationBean<IdempotencyFilter> registration =
			new FilterRegistrationBean<>(new IdempotencyFilter(engine, routes, lazy));
		registration.setName("idempotencyFilter");
		registration.setOrder(properties.getFilterOrder());
		return registration;
	}
}
