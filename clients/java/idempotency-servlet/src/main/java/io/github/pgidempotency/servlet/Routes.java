package io.github.pgidempotency.servlet;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Set;

import io.github.pgidempotency.Route;
import jakarta.servlet.http.HttpServletRequest;

/**
 * A {@link RouteResolver} from a list of method and path templates
 * ({@code /payments/{id}/refunds}: a {@code {name}} matches one path segment),
 * matched in order against the path inside the application (without the
 * context path). A route without an operation gets {@code METHOD template}.
 *
 * <pre>{@code
 * RouteResolver routes = Routes.builder()
 *     .add("POST", "/payments", Route.named("create-payment"))
 *     .add("PATCH", "/payments/{id}", Route.defaults())
 *     .build();
 * }</pre>
 */
public final class Routes implements RouteResolver {
	private record Entry(String method, String[] segments, String template, Route route) {
	}

	private static final Set<String> DEFAULT_METHODS = Set.of("POST", "PATCH");

	private final List<Entry> entries;
	private final Route fallback;

	private Routes(List<Entry> entries, Route fallback) {
		this.entries = List.copyOf(entries);
		this.fallback = fallback;
	}

	/**
	 * Every {@code POST} and {@code PATCH}, each with the operation
	 * {@code METHOD path} (the path as sent, inside the application: templates
	 * are unknown to a plain servlet).
	 *
	 * @param route the settings of every such route (its operation is ignored)
	 * @return the resolver
	 */
	public static Routes everyPostAndPatch(Route route) {
		return new Routes(List.of(), route);
	}

	/** @return a builder */
	public static Builder builder() {
		return new Builder();
	}

	@Override
	public Route resolve(HttpServletRequest request) {
		String method = request.getMethod().toUpperCase(Locale.ROOT);
		String path = pathInApplication(request);
		if (fallback != null)
			return DEFAULT_METHODS.contains(method) ? fallback.withOperation(method + " " + path) : null;
		String[] segments = path.split("/", -1);
		for (Entry e : entries) {
			if (e.method.equals(method) && matches(e.segments, segments))
				return e.route.operation() != null ? e.route : e.route.withOperation(method + " " + e.template);
		}
		return null;
	}

	private static boolean matches(String[] template, String[] path) {
		if (template.length != path.length)
			return false;
		for (int i = 0; i < template.length; i++) {
			String t = template[i];
			boolean variable = t.length() > 2 && t.startsWith("{") && t.endsWith("}");
			if (variable ? path[i].isEmpty() : !t.equals(path[i]))
				return false;
		}
		return true;
	}

	/** The request's path without the context path and the query string. */
	static String pathInApplication(HttpServletRequest request) {
		String uri = request.getRequestURI();
		String context = request.getContextPath();
		if (context != null && !context.isEmpty() && uri.startsWith(context))
			uri = uri.substring(context.length());
		return uri.isEmpty() ? "/" : uri;
	}

	/** Builds {@link Routes}. */
	public static final class Builder {
		private final List<Entry> entries = new ArrayList<>();

		private Builder() {
		}

		/**
		 * Adds a route.
		 *
		 * @param method the HTTP method
		 * @param template the path template, such as {@code /payments/{id}}
		 * @param route its settings
		 * @return this builder
		 */
		public Builder add(String method, String template, Route route) {
			if (!template.startsWith("/"))
				throw new IllegalArgumentException("path template \"" + template + "\" does not begin with /");
			entries.add(new Entry(method.toUpperCase(Locale.ROOT), template.split("/", -1), template, route));
			return this;
		}

		/** @return the resolver */
		public Routes build() {
			return new Routes(entries, null);
		}
	}
}
