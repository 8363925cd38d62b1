package io.github.pgidempotency.demo;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.HashMap;
import java.util.Map;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.web.servlet.context.ServletWebServerApplicationContext;

/**
 * The demo payment API of doc/clients.md on Spring Boot, with
 * idempotency-spring-boot-starter.
 *
 * <pre>
 * JDBC_URL='jdbc:postgresql://127.0.0.1:5432/db?user=idem_demo_app' \
 *   java -jar idempotency-demo.jar [--port N] [--port-file F] [--max-seconds S] [--bench]
 * </pre>
 *
 * It listens on 127.0.0.1 (port 0: any free port, written to the port
 * file), stops on SIGTERM or after --max-seconds. Without JDBC_URL it
 * connects to 127.0.0.1:$PGPORT/$PGDATABASE as $PGUSER.
 */
@SpringBootApplication
public class DemoApplication {
	/**
	 * Starts the demo.
	 *
	 * @param args --port N, --port-file F, --max-seconds S, --bench
	 * @throws IOException where the port file cannot be written
	 */
	public static void main(String[] args) throws IOException {
		int port = 8080;
		String portFile = null;
		long maxSeconds = 0;
		boolean bench = false;
		for (int i = 0; i < args.length; i++) {
			switch (args[i]) {
				case "--port" -> port = Integer.parseInt(args[++i]);
				case "--port-file" -> portFile = args[++i];
				case "--max-seconds" -> maxSeconds = Long.parseLong(args[++i]);
				case "--bench" -> bench = true;
				default -> {
					System.err.println("usage: demo [--port N] [--port-file F] [--max-seconds S] [--bench]");
					System.exit(2);
				}
			}
		}
		Map<String, Object> props = new HashMap<>();
		props.put("server.address", "127.0.0.1");
		props.put("server.port", port);
		props.put("spring.datasource.url", jdbcUrl());
		props.put("demo.bench", bench);
		SpringApplication app = new SpringApplication(DemoApplication.class);
		app.setDefaultProperties(props);
		ServletWebServerApplicationContext ctx = (ServletWebServerApplicationContext) app.run();
		if (portFile != null) {
			Path target = Path.of(portFile);
			Path tmp = Files.createTempFile(target.toAbsolutePath().getParent(), ".port", ".tmp");
			Files.writeString(tmp, Integer.toString(ctx.getWebServer().getPort()));
			Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
		}
		if (maxSeconds > 0) {
			long millis = maxSeconds * 1000;
			Thread stopper = new Thread(() -> {
				try {
					Thread.sleep(millis);
				} catch (InterruptedException e) {
					return;
				}
				System.exit(SpringApplication.exit(ctx));
			}, "max-seconds");
			stopper.setDaemon(true);
			stopper.start();
		}
	}

	/** JDBC_URL, or one built from libpq's PGPORT, PGDATABASE and PGUSER on 127.0.0.1. */
	static String jdbcUrl() {
		String url = System.getenv("JDBC_URL");
		if (url != null && !url.isEmpty())
			return url;
		String user = System.getenv().getOrDefault("PGUSER", System.getProperty("user.name"));
		String db = System.getenv().getOrDefault("PGDATABASE", user);
		String port = System.getenv().getOrDefault("PGPORT", "5432");
		return "jdbc:postgresql://127.0.0.1:" + port + "/" + db + "?user=" + user;
	}
}
