package io.github.pgidempotency.servlet;

import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.InputStreamReader;
import java.net.URLDecoder;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;

/**
 * The request as the handler sees it: its body, already read for the
 * fingerprint, is served again from memory (and form parameters are parsed
 * from it).
 */
final class CachedBodyRequest extends HttpServletRequestWrapper {
	private final byte[] body;
	private Map<String, String[]> parameters;
	private boolean streamUsed;
	private boolean readerUsed;

	CachedBodyRequest(HttpServletRequest request, byte[] body) {
		super(request);
		this.body = body;
	}

	@Override
	public ServletInputStream getInputStream() {
		if (readerUsed)
			throw new IllegalStateException("getReader() has already been called for this request");
		streamUsed = true;
		ByteArrayInputStream in = new ByteArrayInputStream(body);
		return new ServletInputStream() {
			@Override
			public int read() {
				return in.read();
			}

			@Override
			public int read(byte[] b, int off, int len) {
				return in.read(b, off, len);
			}

			@Override
			public boolean isFinished() {
				return in.available() == 0;
			}

			@Override
			public boolean isReady() {
				return true;
			}

			@Override
			public void setReadListener(ReadListener listener) {
				throw new IllegalStateException("the body is already read: non-blocking reads are not supported");
			}
		};
	}

	@Override
	public BufferedReader getReader() {
		if (streamUsed)
			throw new IllegalStateException("getInputStream() has already been called for this request");
		readerUsed = true;
		return new BufferedReader(new InputStreamReader(new ByteArrayInputStream(body), charset()));
	}

	@Override
	public int getContentLength() {
		return body.length;
	}

	@Override
	public long getContentLengthLong() {
		return body.length;
	}

	@Override
	public String getParameter(String name) {
		String[] values = parameters().get(name);
		return values == null || values.length == 0 ? null : values[0];
	}

	@Override
	public Map<String, String[]> getParameterMap() {
		return parameters();
	}

	@Override
	public Enumeration<String> getParameterNames() {
		return Collections.enumeration(parameters().keySet());
	}

	@Override
	public String[] getParameterValues(String name) {
		String[] values = parameters().get(name);
		return values == null ? null : values.clone();
	}

	/** The query string's parameters, then those of a form body. */
	private Map<String, String[]> parameters() {
		if (parameters != null)
			return parameters;
		Map<String, List<String>> all = new LinkedHashMap<>();
		Charset charset = charset();
		parse(getQueryString(), StandardCharsets.UTF_8, all);
		String type = getContentType();
		if (type != null && type.toLowerCase(Locale.ROOT).startsWith("application/x-www-form-urlencoded"))
			parse(new String(body, StandardCharsets.ISO_8859_1), charset, all);
		Map<String, String[]> result = new LinkedHashMap<>();
		all.forEach((k, v) -> result.put(k, v.toArray(new String[0])));
		parameters = Collections.unmodifiableMap(result);
		return parameters;
	}

	private static void parse(String encoded, Charset charset, Map<String, List<String>> into) {
		if (encoded == null || encoded.isEmpty())
			return;
		for (String pair : encoded.split("&")) {
			if (pair.isEmpty())
				continue;
			int eq = pair.indexOf('=');
			String name = eq < 0 ? pair : pair.substring(0, eq);
			String value = eq < 0 ? "" : pair.substring(eq + 1);
			try {
				into.computeIfAbsent(URLDecoder.decode(name, charset), n -> new ArrayList<>())
					.add(URLDecoder.decode(value, charset));
			} catch (IllegalArgumentException e) {
				// a malformed escape: the pair is skipped, as containers do
			}
		}
	}

	private Charset charset() {
		String enc = getCharacterEncoding();
		try {
			return enc == null ? StandardCharsets.UTF_8 : Charset.forName(enc);
		} catch (IllegalArgumentException e) {
			return StandardCharsets.UTF_8;
		}
	}
}
