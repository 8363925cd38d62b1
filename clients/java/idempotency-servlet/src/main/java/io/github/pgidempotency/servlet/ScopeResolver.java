package io.github.pgidempotency.servlet;

import jakarta.servlet.http.HttpServletRequest;

/**
 * The scope of a request: its authenticated principal (a user id, an
 * account, an API client), never a value of a header the client chooses.
 * There is no default; {@code null} (or an empty string) answers 401
 * {@code unauthenticated}. Return {@code null} for a missing or bad
 * credential: a resolver that throws is a failure of the service, answered
 * 500 {@code internal-error}.
 */
@FunctionalInterface
public interface ScopeResolver {
	/**
	 * The principal of a request.
	 *
	 * @param request the request
	 * @return the principal, or {@code null} where there is none
	 * @throws Exception where it cannot be found (500)
	 */
	String resolve(HttpServletRequest request) throws Exception;

	/**
	 * The container's authenticated user ({@link HttpServletRequest#getUserPrincipal()}).
	 *
	 * @return a resolver of the principal's name
	 */
	static ScopeResolver userPrincipal() {
		return request -> request.getUserPrincipal() == null ? null : request.getUserPrincipal().getName();
	}
}
