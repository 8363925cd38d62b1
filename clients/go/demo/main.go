// Command demo is the payment API of doc/clients.md's demo app, on net/http
// with chi and this package's middleware:
//
//	POST /payments        Idempotency-Key: "<key>"   Authorization: Bearer <token>
//	{"order_id": "o-1", "amount": 100, "currency": "EUR"}
//	GET  /payments/{id}   Authorization: Bearer <token>
//
// It listens on 127.0.0.1 (--port N, 0 for any free port, written to
// --port-file F), stops on SIGTERM or after --max-seconds S, and connects
// with libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE) or
// DATABASE_URL, to a database with the extension and
// clients/demo/schema.sql. DEMO_TOKENS holds the token=account pairs.
// --bench adds POST /bench/middleware and POST /bench/by-hand, the two
// sides of the overhead benchmark (table bench_effects).
//
// Statements use pgx's cache_describe mode, which works behind PgBouncer in
// transaction mode; a default_query_exec_mode in DATABASE_URL overrides it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempotency "github.com/pg-idempotency/idempotency/clients/go"
)

func main() {
	port := flag.Int("port", 0, "port to listen on, on 127.0.0.1 (0: any free port)")
	portFile := flag.String("port-file", "", "write the port listened on to this file")
	maxSeconds := flag.Float64("max-seconds", 0, "stop after this many seconds (0: run until SIGTERM)")
	bench := flag.Bool("bench", false, "serve the overhead benchmark's routes too")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, *port, *portFile, *maxSeconds, *bench); err != nil {
		log.Error("demo: " + err.Error())
		os.Exit(1)
	}
}

// newPool connects with libpq's environment or DATABASE_URL
func newPool(ctx context.Context) (*pgxpool.Pool, error) {
	dsn := os.Getenv("DATABASE_URL")
	config, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bad connection settings: %w", err)
	}
	if !strings.Contains(dsn, "default_query_exec_mode") {
		config.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	config.MaxConns = 16
	return pgxpool.NewWithConfig(ctx, config)
}

// newApp checks the database (the extension's version, and bench_effects
// with --bench) and builds the application
func newApp(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, bench bool) (*app, error) {
	a := &app{pool: pool, tokens: parseTokens(os.Getenv("DEMO_TOKENS"))}
	idem, err := idempotency.New(ctx, pool, idempotency.WithScope(a.account), idempotency.WithLogger(log))
	if err != nil {
		return nil, err
	}
	a.idem = idem
	if bench {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass('bench_effects') IS NOT NULL").Scan(&exists); err != nil {
			return nil, err
		}
		if !exists {
			if _, err := pool.Exec(ctx, "CREATE TABLE bench_effects (id bigserial PRIMARY KEY, k text)"); err != nil {
				return nil, fmt.Errorf("--bench needs the table bench_effects (id bigserial primary key, k text): %w", err)
			}
		}
	}
	return a, nil
}

func run(log *slog.Logger, port int, portFile string, maxSeconds float64, bench bool) error {
	ctx := context.Background()
	pool, err := newPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := newApp(ctx, pool, log, bench)
	if err != nil {
		return err
	}

	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	actual := listener.Addr().(*net.TCPAddr).Port
	if portFile != "" {
		if err := os.WriteFile(portFile+".tmp", []byte(fmt.Sprintf("%d\n", actual)), 0o644); err != nil {
			return err
		}
		if err := os.Rename(portFile+".tmp", portFile); err != nil {
			return err
		}
	}
	server := &http.Server{Handler: a.routes(bench), ReadHeaderTimeout: 10 * time.Second}
	log.Info("demo: listening", "addr", listener.Addr().String(), "bench", bench)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var timeout <-chan time.Time
	if maxSeconds > 0 {
		timeout = time.After(time.Duration(maxSeconds * float64(time.Second)))
	}
	go func() {
		select {
		case <-stop:
		case <-timeout:
		}
		// in-flight requests finish and commit before the pool closes
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	if err := server.Serve(listener); err != http.ErrServerClosed {
		return err
	}
	log.Info("demo: stopped")
	return nil
}
