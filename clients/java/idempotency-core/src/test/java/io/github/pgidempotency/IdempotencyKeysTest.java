package io.github.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Optional;

import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junit.jupiter.api.Test;

class IdempotencyKeysTest {
	private static String parse(String... fields) {
		return IdempotencyKeys.parse(List.of(fields)).orElseThrow();
	}

	@Test
	void quotedAndBareAreOneKey() {
		assertEquals("abc", parse("\"abc\""));
		assertEquals("abc", parse("abc"));
		assertEquals("abc", parse(" \t\"abc\"\t "));
		assertEquals("a b", parse("  a b  "));
	}

	@Test
	void escapesAreDecoded() {
		assertEquals("a\"b\\c", parse("\"a\\\"b\\\\c\""));
	}

	@Test
	void noFieldIsNoKey() {
		assertEquals(Optional.empty(), IdempotencyKeys.parse(List.of()));
		assertEquals(Optional.empty(), IdempotencyKeys.parse(null));
	}

	@Test
	void twoFieldsAreRefused() {
		IdempotencyException e = assertThrows(IdempotencyException.class, () -> parse("a", "b"));
		assertEquals(ProblemCode.INVALID_KEY, e.code());
		assertTrue(e.getMessage().contains("more than one"));
	}

	@ParameterizedTest
	@ValueSource(strings = {"\"a\", \"b\"", "a, b", "a,b", "\"abc", "\"a\\nb\"", "\"a\\", "\"a\";p=1", "\"a\" x",
		"\"\"", "", "   ", "\"caf\u00e9\"", "\"tab\there\""})
	void malformedKeysAreRefused(String field) {
		IdempotencyException e = assertThrows(IdempotencyException.class, () -> parse(field));
		assertEquals(ProblemCode.INVALID_KEY, e.code(), field);
	}

	@Test
	void bareKeysPassToTheExtensionAsTheyAre() {
		// the extension's own checks (22023) judge the bare form's characters
		assertEquals("chave-\u00e9", parse("chave-\u00e9"));
		assertEquals("a\"b", parse("a\"b"));
	}
}
