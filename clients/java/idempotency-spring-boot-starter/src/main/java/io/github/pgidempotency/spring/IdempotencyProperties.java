package io.github.pgidempotency.spring;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import io.github.pgidempotency.IdempotencySettings;
import io.github.pgidempotency.ProblemCode;
import io.github.pgidempotency.ProblemMapping;
import io.github.pgidempotency.StatusSet;
import org.springframework.boot.context.properties.ConfigurationProperties;
import org.springframework.util.ClassUtils;
import org.springframework.util.unit.DataSize;

/**
 * The {@code idempotency.*} properties: doc/clients.md's settings.
 *
 * <pre>
 * idempotency.ttl=24h
 * idempotency.replay-headers=content-type,location,etag
 * idempotency.retryable-statuses=5xx,408,429
 * idempotency.retry-after=2
 * idempotency.final-errors=com.example.CardDeclinedException
 * idempotency.mapping.in-progress.status=429
 * idempotency.sql-states.57014=retry
 * </pre>
 */
@ConfigurationProperties(prefix = "idempotency")
public class IdempotencyProperties {
	/** Whether the auto-configuration is on. */
	private boolean enabled = true;

	/** How long a completed record replays, from its completion; unset: the server's idempotency.default_ttl. */
	private Duration ttl;

	/** Whether a missing Idempotency-Key is 400 missing-key (or runs the handler without idempotency). */
	private boolean keyRequired = true;

	/** The allow-list of response headers stored and replayed. */
	private List<String> replayHeaders = new ArrayList<>(List.of("content-type", "location"));

	/** Handler statuses that roll back instead of completing: codes and classes (5xx). */
	private List<String> retryableStatuses = new ArrayList<>(List.of("5xx", "408", "429"));

	/**
	 * Raised exceptions that are completed with the status and body Spring MVC
	 * resolved them to, instead of rolled back: fully qualified class names
	 * (an instance of one, subclasses included, is final).
	 */
	private List<String> finalErrors = new ArrayList<>();

	/**
	 * How long the key's transaction may run: past it its connection is ended
	 * (the server rolls back and frees the key) and the answer is 503
	 * time-limit; unset: no limit.
	 */
	private Duration timeLimit;

	/** The largest request body an idempotent route takes (over it: 413 payload-too-large). */
	private DataSize maxRequestBody = DataSize.ofMegabytes(1);

	/** The largest response stored, as its envelope (over it: rolled back, 500); unset: no limit. */
	private DataSize maxStoredResponse;

	/** The Retry-After seconds of the cases that have one. */
	private int retryAfter = 1;

	/** Changes to the mapping table, by problem code (in-progress, read-only, ...). */
	private Map<String, Mapping> mapping = new LinkedHashMap<>();

	/** More SQLSTATEs mapped to a problem code (57014=retry: a statement timeout). */
	private Map<String, String> sqlStates = new LinkedHashMap<>();

	/** Whether start-up checks that the extension is installed at version 0.2.0 or later. */
	private boolean checkVersion = true;

	/** The order of the servlet filter (after Spring Security's, at -100). */
	private int filterOrder = 0;

	/** One row of the mapping table. */
	public static class Mapping {
		/** The HTTP status of the case; unset: as it is. */
		private Integer status;

		/** Whether the case sends Retry-After; unset: as it is. */
		private Boolean retryAfter;

		/** @return the status, or null */
		public Integer getStatus() {
			return status;
		}

		/** @param status the status */
		public void setStatus(Integer status) {
			this.status = status;
		}

		/** @return whether it sends Retry-After, or null */
		public Boolean getRetryAfter() {
			return retryAfter;
		}

		/** @param retryAfter whether it sends Retry-After */
		public void setRetryAfter(Boolean retryAfter) {
			this.retryAfter = retryAfter;
		}
	}

	/**
	 * The core settings these properties describe.
	 *
	 * @return the settings
	 * @throws IllegalArgumentException for a bad value
	 */
	public IdempotencySettings toSettings() {
		return toSettingsBuilder().build();
	}

	/**
	 * A builder holding the settings these properties describe.
	 *
	 * @return the builder
	 * @throws IllegalArgumentException for a bad value
	 */
	public IdempotencySettings.Builder toSettingsBuilder() {
		ProblemMapping.Builder m = ProblemMapping.defaults().toBuilder();
		ProblemMapping defaults = ProblemMapping.defaults();
		mapping.forEach((code, row) -> {
			ProblemCode c = ProblemCode.of(code);
			ProblemMapping.Entry d = defaults.entry(c);
			m.entry(c, row.status != null ? row.status : d.status(),
				row.retryAfter != null ? row.retryAfter : d.retryAfter());
		});
		sqlStates.forEach((state, code) -> m.sqlState(state, ProblemCode.of(code)));
		return IdempotencySettings.builder()
			.ttl(ttl)
			.keyRequired(keyRequired)
			.replayHeaders(replayHeaders)
			.retryableStatuses(StatusSet.parse(retryableStatuses))
			.retryAfterSeconds(retryAfter)
			.mapping(m.build())
			.finalErrors(errorTypes(finalErrors))
			.timeLimit(timeLimit)
			.maxRequestBody(maxRequestBody.toBytes())
			.maxStoredResponse(maxStoredResponse == null ? Long.MAX_VALUE : maxStoredResponse.toBytes());
	}

	/** The classes of idempotency.final-errors. */
	static List<Class<? extends Throwable>> errorTypes(List<String> names) {
		List<Class<? extends Throwable>> types = new ArrayList<>();
		for (String name : names) {
			Class<?> type;
			try {
				type = ClassUtils.forName(name.trim(), null);
			} catch (ClassNotFoundException | LinkageError e) {
				throw new IllegalArgumentException("idempotency.final-errors: no class " + name.trim(), e);
			}
			if (!Throwable.class.isAssignableFrom(type))
				throw new IllegalArgumentException("idempotency.final-errors: " + name.trim() + " is not an exception");
			types.add(type.asSubclass(Throwable.class));
		}
		return types;
	}

	/** @return whether the auto-configuration is on */
	public boolean isEnabled() {
		return enabled;
	}

	/** @param enabled whether the auto-configuration is on */
	public void setEnabled(boolean enabled) {
		this.enabled = enabled;
	}

	/** @return the ttl, or null */
	public Duration getTtl() {
		return ttl;
	}

	/** @param ttl the ttl */
	public void setTtl(Duration ttl) {
		this.ttl = ttl;
	}

	/** @return whether the key is required */
	public boolean isKeyRequired() {
		return keyRequired;
	}

	/** @param keyRequired whether the key is required */
	public void setKeyRequired(boolean keyRequired) {
		this.keyRequired = keyRequired;
	}

	/** @return the replay allow-list */
	public List<String> getReplayHeaders() {
		return replayHeaders;
	}

	/** @param replayHeaders the replay allow-list */
	public void setReplayHeaders(List<String> replayHeaders) {
		this.replayHeaders = replayHeaders;
	}

	/** @return the retryable statuses */
	public List<String> getRetryableStatuses() {
		return retryableStatuses;
	}

	/** @param retryableStatuses the retryable statuses */
	public void setRetryableStatuses(List<String> retryableStatuses) {
		this.retryableStatuses = retryableStatuses;
	}

	/** @return the request body limit */
	public DataSize getMaxRequestBody() {
		return maxRequestBody;
	}

	/** @param maxRequestBody the request body limit */
	public void setMaxRequestBody(DataSize maxRequestBody) {
		this.maxRequestBody = maxRequestBody;
	}

	/** @return the stored-response limit, or null */
	public DataSize getMaxStoredResponse() {
		return maxStoredResponse;
	}

	/** @param maxStoredResponse the stored-response limit */
	public void setMaxStoredResponse(DataSize maxStoredResponse) {
		this.maxStoredResponse = maxStoredResponse;
	}

	/** @return the time limit, or null */
	public Duration getTimeLimit() {
		return timeLimit;
	}

	/** @param timeLimit the time limit */
	public void setTimeLimit(Duration timeLimit) {
		this.timeLimit = timeLimit;
	}

	/** @return the final errors' class names */
	public List<String> getFinalErrors() {
		return finalErrors;
	}

	/** @param finalErrors the final errors' class names */
	public void setFinalErrors(List<String> finalErrors) {
		this.finalErrors = finalErrors;
	}

	/** @return the Retry-After seconds */
	public int getRetryAfter() {
		return retryAfter;
	}

	/** @param retryAfter the Retry-After seconds */
	public void setRetryAfter(int retryAfter) {
		this.retryAfter = retryAfter;
	}

	/** @return the mapping changes */
	public Map<String, Mapping> getMapping() {
		return mapping;
	}

	/** @param mapping the mapping changes */
	public void setMapping(Map<String, Mapping> mapping) {
		this.mapping = mapping;
	}

	/** @return the extra SQLSTATEs */
	public Map<String, String> getSqlStates() {
		return sqlStates;
	}

	/** @param sqlStates the extra SQLSTATEs */
	public void setSqlStates(Map<String, String> sqlStates) {
		this.sqlStates = sqlStates;
	}

	/** @return whether start-up checks the version */
	public boolean isCheckVersion() {
		return checkVersion;
	}

	/** @param checkVersion whether start-up checks the version */
	public void setCheckVersion(boolean checkVersion) {
		this.checkVersion = checkVersion;
	}

	/** @return the filter's order */
	public int getFilterOrder() {
		return filterOrder;
	}

	/** @param filterOrder the filter's order */
	public void setFilterOrder(int filterOrder) {
		this.filterOrder = filterOrder;
	}
}
