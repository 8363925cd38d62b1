package io.github.pgidempotency.demo;

import io.github.pgidempotency.ProblemCode;
import org.springframework.http.MediaType;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Component;

/**
 * The demo's own problem answers (card-declined, bad-request, not-found,
 * unauthenticated), written in jsonb's formatting so that the first answer
 * and its replays are the same bytes.
 */
@Component
public class Problems {
	private final JdbcTemplate jdbc;

	Problems(JdbcTemplate jdbc) {
		this.jdbc = jdbc;
	}

	/**
	 * A problem answer.
	 *
	 * @param status the HTTP status
	 * @param code the problem code
	 * @param title the title
	 * @param detail the detail sentence
	 * @return the response
	 */
	public ResponseEntity<String> problem(int status, String code, String title, String detail) {
		String body = jdbc.queryForObject("SELECT jsonb_build_object('type', ?::text, 'title', ?::text, "
			+ "'status', ?::int, 'detail', ?::text, 'code', ?::text)::text", String.class,
			ProblemCode.TYPE_BASE + code, title, status, detail, code);
		return ResponseEntity.status(status).contentType(MediaType.APPLICATION_PROBLEM_JSON).body(body);
	}
}
