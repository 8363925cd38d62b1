package io.github.pgidempotency.spring;

import io.github.pgidempotency.servlet.IdempotencyFilter;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import org.springframework.core.Ordered;
import org.springframework.web.servlet.HandlerExceptionResolver;
import org.springframework.web.servlet.ModelAndView;

/**
 * Tells the {@link IdempotencyFilter} that the handler raised: a
 * {@link HandlerExceptionResolver} of the highest precedence that records
 * every exception Spring MVC resolves ({@link IdempotencyFilter#raised}) and
 * resolves none itself, as Spring Boot's {@code DefaultErrorAttributes} does.
 * Without it the filter would see only the status the later resolvers
 * write (a {@code ResponseStatusException}'s 402) and complete it, keeping
 * the handler's partial work; with it that work is rolled back, unless the
 * exception is one of the final errors ({@code idempotency.final-errors}).
 */
public class RaisedErrorRecorder implements HandlerExceptionResolver, Ordered {
	/** The recorder; Spring MVC finds it as a bean. */
	public RaisedErrorRecorder() {
	}

	@Override
	public ModelAndView resolveException(HttpServletRequest request, HttpServletResponse response, Object handler,
		Exception ex) {
		IdempotencyFilter.raised(request, ex);
		return null;
	}

	@Override
	public int getOrder() {
		return Ordered.HIGHEST_PRECEDENCE;
	}
}
