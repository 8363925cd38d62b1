package io.github.pgidempotency.spring;

import java.lang.reflect.Method;
import java.time.Duration;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import io.github.pgidempotency.Route;
import io.github.pgidempotency.servlet.RouteResolver;
import io.github.pgidempotency.servlet.ScopeResolver;
import jakarta.servlet.http.HttpServletRequest;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.SmartInitializingSingleton;
import org.springframework.boot.convert.DurationStyle;
import org.springframework.core.annotation.AnnotatedElementUtils;
import org.springframework.web.method.HandlerMethod;
import org.springframework.web.servlet.HandlerExecutionChain;
import org.springframework.web.servlet.HandlerMapping;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;
import org.springframework.web.util.ServletRequestPathUtils;

/**
 * The {@link RouteResolver} of {@link Idempotent} controller methods: it asks
 * Spring MVC's handler mappings which method a request goes to, and reads
 * the annotation. At start-up it checks every annotated method's settings,
 * and that a {@link ScopeResolver} bean exists where any method is annotated.
 */
public class AnnotatedRouteResolver implements RouteResolver, SmartInitializingSingleton {
	private static final Set<String> CLASS_LEVEL_METHODS = Set.of("POST", "PATCH");

	private final ObjectProvider<RequestMappingHandlerMapping> mappings;
	private final ObjectProvider<ScopeResolver> scope;
	private final Map<Target, Annotated> annotated = new ConcurrentHashMap<>();
	private volatile List<RequestMappingHandlerMapping> handlerMappings;

	/**
	 * A resolver.
	 *
	 * @param mappings Spring MVC's handler mappings
	 * @param scope the scope function, which must exist where a method is annotated
	 */
	public AnnotatedRouteResolver(ObjectProvider<RequestMappingHandlerMapping> mappings,
		ObjectProvider<ScopeResolver> scope) {
		this.mappings = mappings;
		this.scope = scope;
	}

	/** A handler method of a controller class (a class-level annotation is its class's) */
	private record Target(Class<?> type, Method method) {
	}

	/**
	 * A handler method's {@link Idempotent}, read once: its route (null where
	 * it has none) and whether the annotation is on the method itself
	 */
	private record Annotated(Route route, boolean onMethod) {
	}

	private static final Annotated NOT_ANNOTATED = new Annotated(null, false);

	@Override
	public void afterSingletonsInstantiated() {
		int annotated = 0;
		for (RequestMappingHandlerMapping m : handlerMappings()) {
			for (HandlerMethod hm : m.getHandlerMethods().values()) {
				if (annotated(hm).route() != null)
					annotated++;
			}
		}
		if (annotated > 0 && scope.getIfAvailable() == null)
			throw new IllegalStateException(annotated + " @Idempotent handler method(s) but no ScopeResolver bean: "
				+ "define one that returns the request's authenticated principal (a user id, an account)");
	}

	@Override
	public Route resolve(HttpServletRequest request) {
		boolean parsed = ServletRequestPathUtils.hasParsedRequestPath(request);
		if (!parsed)
			ServletRequestPathUtils.parseAndCache(request);
		try {
			for (RequestMappingHandlerMapping m : handlerMappings()) {
				HandlerExecutionChain chain;
				try {
					chain = m.getHandler(request);
				} catch (Exception e) {
					// no handler method takes it (405, 415, ...): Spring MVC answers it
					return null;
				}
				if (chain == null)
					continue;
				if (!(chain.getHandler() instanceof HandlerMethod hm))
					return null;
				Annotated a = annotated(hm);
				if (a.route() == null)
					return null;
				String method = request.getMethod().toUpperCase(Locale.ROOT);
				if (!a.onMethod() && !CLASS_LEVEL_METHODS.contains(method))
					return null;
				Route route = a.route();
				if (route.operation() != null)
					return route;
				Object pattern = request.getAttribute(HandlerMapping.BEST_MATCHING_PATTERN_ATTRIBUTE);
				return route.withOperation(method + " " + (pattern != null ? pattern : request.getRequestURI()));
			}
			return null;
		} finally {
			if (!parsed)
				ServletRequestPathUtils.clearParsedRequestPath(request);
		}
	}

	/** Spring MVC's handler mappings, looked up once. */
	private List<RequestMappingHandlerMapping> handlerMappings() {
		List<RequestMappingHandlerMapping> list = handlerMappings;
		if (list == null) {
			list = mappings.orderedStream().toList();
			handlerMappings = list;
		}
		return list;
	}

	/** A handler method's annotation and route settings, read and checked once per method and class. */
	private Annotated annotated(HandlerMethod hm) {
		return annotated.computeIfAbsent(new Target(hm.getBeanType(), hm.getMethod()), target -> {
			Idempotent onMethod = AnnotatedElementUtils.findMergedAnnotation(target.method(), Idempotent.class);
			Idempotent a = onMethod != null ? onMethod
				: AnnotatedElementUtils.findMergedAnnotation(target.type(), Idempotent.class);
			if (a == null)
				return NOT_ANNOTATED;
			try {
				Duration ttl = a.ttl().isEmpty() ? null : DurationStyle.detectAndParse(a.ttl());
				Boolean keyRequired = switch (a.key()) {
					case DEFAULT -> null;
					case REQUIRED -> true;
					case OPTIONAL -> false;
				};
				return new Annotated(new Route(a.operation(), List.of(a.fingerprint()), keyRequired, ttl), onMethod != null);
			} catch (IllegalArgumentException e) {
				throw new IllegalStateException("bad @Idempotent on " + target.method() + ": " + e.getMessage(), e);
			}
		});
	}
}
