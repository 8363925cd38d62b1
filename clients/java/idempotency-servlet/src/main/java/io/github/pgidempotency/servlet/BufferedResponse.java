package io.github.pgidempotency.servlet;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

import io.github.pgidempotency.CapturedResponse;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;

/**
 * The response as the handler writes it: status and headers go to the real
 * response (which stays uncommitted), the body to memory, so that nothing
 * reaches the client before COMMIT.
 */
final class BufferedResponse extends HttpServletResponseWrapper {
	private final ByteArrayOutputStream buffer = new ByteArrayOutputStream();
	private ServletOutputStream stream;
	private PrintWriter writer;

	BufferedResponse(HttpServletResponse response) {
		super(response);
	}

	@Override
	public ServletOutputStream getOutputStream() {
		if (writer != null)
			throw new IllegalStateException("getWriter() has already been called for this response");
		if (stream == null)
			stream = new ServletOutputStream() {
				@Override
				public void write(int b) {
					buffer.write(b);
				}

				@Override
				public void write(byte[] b, int off, int len) {
					buffer.write(b, off, len);
				}

				@Override
				public boolean isReady() {
					return true;
				}

				@Override
				public void setWriteListener(WriteListener listener) {
					throw new IllegalStateException("non-blocking writes are not supported inside an idempotent request");
				}
			};
		return stream;
	}

	@Override
	public PrintWriter getWriter() {
		if (stream != null)
			throw new IllegalStateException("getOutputStream() has already been called for this response");
		if (writer == null) {
			String enc = getCharacterEncoding();
			Charset charset = enc == null ? StandardCharsets.ISO_8859_1 : Charset.forName(enc);
			writer = new PrintWriter(new OutputStreamWriter(buffer, charset));
		}
		return writer;
	}

	@Override
	public void flushBuffer() {
		if (writer != null)
			writer.flush();
	}

	@Override
	public boolean isCommitted() {
		return false;
	}

	@Override
	public void reset() {
		super.reset();
		resetBuffer();
	}

	@Override
	public void resetBuffer() {
		if (writer != null)
			writer.flush();
		buffer.reset();
	}

	@Override
	public void setContentLength(int len) {
		// set from the buffer when the response is written
	}

	@Override
	public void setContentLengthLong(long len) {
		// set from the buffer when the response is written
	}

	@Override
	public void setHeader(String name, String value) {
		if (!"content-length".equalsIgnoreCase(name))
			super.setHeader(name, value);
	}

	@Override
	public void addHeader(String name, String value) {
		if (!"content-length".equalsIgnoreCase(name))
			super.addHeader(name, value);
	}

	@Override
	public void sendError(int sc) {
		sendError(sc, null);
	}

	@Override
	public void sendError(int sc, String msg) {
		// No error page inside the transaction: the status, with an empty body
		resetBuffer();
		setStatus(sc);
	}

	@Override
	public void sendRedirect(String location) {
		resetBuffer();
		setStatus(SC_FOUND);
		setHeader("Location", location);
	}

	/** The response so far. */
	CapturedResponse capture() {
		flushBuffer();
		HttpServletResponse r = (HttpServletResponse) getResponse();
		Map<String, List<String>> headers = new LinkedHashMap<>();
		for (String name : r.getHeaderNames()) {
			String lower = name.toLowerCase(Locale.ROOT);
			if (lower.equals("content-type") || lower.equals("content-length"))
				continue;
			headers.computeIfAbsent(lower, n -> new ArrayList<>()).addAll(r.getHeaders(name));
		}
		if (r.getContentType() != null)
			headers.put("content-type", List.of(r.getContentType()));
		return new CapturedResponse(r.getStatus(), headers, buffer.toByteArray());
	}

	/** Sends the buffered body through the real response (its status and headers are set). */
	void commitTo(HttpServletResponse response) throws IOException {
		flushBuffer();
		response.setContentLength(buffer.size());
		buffer.writeTo(response.getOutputStream());
		response.flushBuffer();
	}
}
