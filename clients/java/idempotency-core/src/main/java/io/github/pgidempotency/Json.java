package io.github.pgidempotency;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.core.json.JsonWriteFeature;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.ObjectWriter;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.fasterxml.jackson.databind.cfg.JsonNodeFeature;

/** The strict JSON reader and writer the library uses (RFC 8259, exact numbers). */
final class Json {
	/**
	 * The deepest nesting of arrays and objects a body may have and still be
	 * JSON to the library, the same in every language (doc/clients.md, "The
	 * fingerprint"): a body nested deeper is bytes ({@code body_base64}).
	 */
	static final int MAX_BODY_DEPTH = 256;

	static final ObjectMapper MAPPER = mapper(JsonFactory.builder().build());

	/** {@link #MAPPER}, reading at most {@link #MAX_BODY_DEPTH} levels */
	private static final ObjectMapper BODY_MAPPER = mapper(JsonFactory.builder()
		.streamReadConstraints(StreamReadConstraints.builder().maxNestingDepth(MAX_BODY_DEPTH).build())
		.build());

	private static ObjectMapper mapper(JsonFactory factory) {
		return JsonMapper.builder(factory)
			.disable(JsonNodeFeature.STRIP_TRAILING_BIGDECIMAL_ZEROES)
			.enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
			.enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
			.disable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
			.build();
	}

	private Json() {
	}

	/**
	 * The value of a JSON text in UTF-8, or null where it is not one: bytes
	 * that are not UTF-8 are not JSON (Jackson would read UTF-16 and skip a
	 * BOM, which no other language's library does).
	 */
	static JsonNode parseOrNull(byte[] text) {
		return parseOrNull(MAPPER, text);
	}

	/**
	 * A body's value as {@link #parseOrNull(byte[])} reads it, or null where
	 * it is nested more than {@link #MAX_BODY_DEPTH} levels deep
	 */
	static JsonNode parseBodyOrNull(byte[] text) {
		return parseOrNull(BODY_MAPPER, text);
	}

	private static JsonNode parseOrNull(ObjectMapper mapper, byte[] text) {
		if (text == null || text.length == 0)
			return null;
		try {
			return mapper.readTree(StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(text)).toString());
		} catch (IOException e) {
			return null;
		}
	}

	/** A JSON value as UTF-8. */
	static byte[] bytes(JsonNode node) {
		try {
			return MAPPER.writeValueAsBytes(node);
		} catch (JsonProcessingException e) {
			throw new UncheckedIOException(e);
		}
	}

	/** A JSON value as text. */
	static String text(JsonNode node) {
		try {
			return MAPPER.writeValueAsString(node);
		} catch (JsonProcessingException e) {
			throw new UncheckedIOException(e);
		}
	}

	private static final ObjectWriter ASCII = MAPPER.writer().with(JsonWriteFeature.ESCAPE_NON_ASCII);

	/**
	 * A JSON value as text of ASCII only: every other character escaped, so
	 * that a lone surrogate reaches the server as the escape it was sent as
	 * (which the server refuses, SQLSTATE 22P02, as it does from every other
	 * language) rather than as the {@code ?} a UTF-8 encoder makes of it.
	 */
	static String asciiText(JsonNode node) {
		try {
			return ASCII.writeValueAsString(node);
		} catch (JsonProcessingException e) {
			throw new UncheckedIOException(e);
		}
	}

	/** Whether a Content-Type names JSON: application/json or a +json subtype. */
	static boolean isJsonMediaType(String contentType) {
		if (contentType == null)
			return false;
		int semi = contentType.indexOf(';');
		String media = (semi < 0 ? contentType : contentType.substring(0, semi)).trim()
			.toLowerCase(java.util.Locale.ROOT);
		int slash = media.indexOf('/');
		if (slash <= 0 || slash == media.length() - 1)
			return false;
		String subtype = media.substring(slash + 1);
		return media.equals("application/json") || subtype.endsWith("+json");
	}
}
