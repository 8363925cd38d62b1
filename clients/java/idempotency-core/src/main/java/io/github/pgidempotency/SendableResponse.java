package io.github.pgidempotency;

import java.util.List;
import java.util.Map;

/**
 * The check of a response before it is completed (doc/clients.md, "Only what
 * can be sent is committed"): a status from 200 to 599, every header name an
 * RFC 9110 token, every header value visible ASCII with spaces and tabs (no
 * CR, LF, NUL or other control character, nothing above 0x7E: what every
 * server here writes unchanged). The body's part, that PostgreSQL can store
 * it unchanged, is {@link ResponseEnvelope#encode}'s.
 */
final class SendableResponse {
	private SendableResponse() {
	}

	/**
	 * Checks a response.
	 *
	 * @param response the handler's response
	 * @throws UnsendableResponseException naming the first thing that cannot be sent
	 */
	static void check(CapturedResponse response) {
		if (response.status() < 200 || response.status() > 599)
			throw new UnsendableResponseException("the status " + response.status() + " is not from 200 to 599");
		for (Map.Entry<String, List<String>> h : response.headers().entrySet()) {
			if (!isToken(h.getKey()))
				throw new UnsendableResponseException("a response header name is not an RFC 9110 token");
			for (String value : h.getValue())
				if (!isFieldValue(value))
					throw new UnsendableResponseException("the value of the response header \"" + h.getKey()
						+ "\" has a control character or a character above 0x7E");
		}
	}

	/** RFC 9110 token: one or more tchar. */
	static boolean isToken(String s) {
		if (s == null || s.isEmpty())
			return false;
		for (int i = 0; i < s.length(); i++) {
			char c = s.charAt(i);
			boolean alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
			if (!alnum && "!#$%&'*+-.^_`|~".indexOf(c) < 0)
				return false;
		}
		return true;
	}

	/** Visible ASCII, spaces and tabs only. */
	static boolean isFieldValue(String s) {
		if (s == null)
			return false;
		for (int i = 0; i < s.length(); i++) {
			char c = s.charAt(i);
			if ((c < 0x20 && c != '\t') || c > 0x7E)
				return false;
		}
		return true;
	}
}
