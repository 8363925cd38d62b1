package io.github.pgidempotency.servlet;

import io.github.pgidempotency.Route;
import jakarta.servlet.http.HttpServletRequest;

/**
 * Which requests are idempotent, and with which settings.
 */
@FunctionalInterface
public interface RouteResolver {
	/**
	 * The route of a request.
	 *
	 * @param request the request
	 * @return its settings (with the operation filled in, or {@code null} for
	 *         {@code METHOD path}), or {@code null} where the request is not
	 *         idempotent and passes through untouched
	 */
	Route resolve(HttpServletRequest request);
}
