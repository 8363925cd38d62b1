package io.github.pgidempotency.demo;

import java.util.HashMap;
import java.util.Map;

import io.github.pgidempotency.servlet.ScopeResolver;
import jakarta.servlet.http.HttpServletRequest;
import org.springframework.stereotype.Component;

/**
 * Authentication: "Authorization: Bearer TOKEN", the tokens being the
 * comma-separated token=account pairs of DEMO_TOKENS. The account is the
 * idempotency scope.
 */
@Component
public class Accounts implements ScopeResolver {
	private final Map<String, String> tokens = new HashMap<>();

	/** Reads DEMO_TOKENS (default token-a=acct-a,token-b=acct-b). */
	public Accounts() {
		String spec = System.getenv().getOrDefault("DEMO_TOKENS", "token-a=acct-a,token-b=acct-b");
		for (String pair : spec.split(",")) {
			int eq = pair.indexOf('=');
			if (eq > 0)
				tokens.put(pair.substring(0, eq).trim(), pair.substring(eq + 1).trim());
		}
	}

	/**
	 * The account of a request.
	 *
	 * @param request the request
	 * @return the account, or null for a missing or unknown token
	 */
	public String accountOf(HttpServletRequest request) {
		String auth = request.getHeader("Authorization");
		if (auth == null || !auth.regionMatches(true, 0, "Bearer ", 0, 7))
			return null;
		return tokens.get(auth.substring(7).trim());
	}

	@Override
	public String resolve(HttpServletRequest request) {
		return accountOf(request);
	}
}
