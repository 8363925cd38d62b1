package io.github.pgidempotency.spring;

import java.sql.SQLException;

import javax.sql.DataSource;

import io.github.pgidempotency.VersionCheck;
import org.springframework.beans.factory.InitializingBean;

/**
 * The start-up check of the extension's version: the application does not
 * start where the extension is missing or older than {@link VersionCheck#MINIMUM}.
 */
public class IdempotencyVersionCheck implements InitializingBean {
	private final DataSource dataSource;
	private final boolean enabled;
	private volatile String version;

	/**
	 * A check.
	 *
	 * @param dataSource the application's data source
	 * @param enabled whether to check ({@code idempotency.check-version})
	 */
	public IdempotencyVersionCheck(DataSource dataSource, boolean enabled) {
		this.dataSource = dataSource;
		this.enabled = enabled;
	}

	@Override
	public void afterPropertiesSet() throws SQLException {
		if (enabled)
			version = VersionCheck.require(dataSource);
	}

	/** @return the version found, or {@code null} where the check is off */
	public String version() {
		return version;
	}
}
