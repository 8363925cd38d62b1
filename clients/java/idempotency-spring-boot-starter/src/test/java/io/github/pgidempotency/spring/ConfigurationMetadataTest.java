package io.github.pgidempotency.spring;

import static org.assertj.core.api.Assertions.assertThat;

import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.junit.jupiter.api.Test;

/** The configuration processor's metadata: every idempotency.* property, with its description. */
class ConfigurationMetadataTest {
	@Test
	void everyPropertyIsDescribed() throws Exception {
		JsonNode metadata;
		try (InputStream in = IdempotencyProperties.class.getResourceAsStream(
			"/META-INF/spring-configuration-metadata.json")) {
			assertThat(in).as("META-INF/spring-configuration-metadata.json").isNotNull();
			metadata = new ObjectMapper().readTree(in);
		}
		List<String> names = new ArrayList<>();
		for (JsonNode p : metadata.get("properties")) {
			names.add(p.get("name").asText());
			assertThat(p.path("description").asText()).as(p.get("name").asText()).isNotEmpty();
		}
		assertThat(names).contains("idempotency.enabled", "idempotency.ttl", "idempotency.key-required",
			"idempotency.replay-headers", "idempotency.retryable-statuses", "idempotency.final-errors",
			"idempotency.time-limit", "idempotency.max-request-body", "idempotency.max-stored-response",
			"idempotency.retry-after", "idempotency.mapping", "idempotency.sql-states",
			"idempotency.check-version", "idempotency.filter-order");
	}
}
