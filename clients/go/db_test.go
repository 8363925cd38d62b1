package idempotency

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tests run against a real PostgreSQL with the extension installed,
// through libpq's environment (PGHOST, PGPORT, PGUSER a superuser,
// PGDATABASE an existing database to connect to first). TestMain creates
// three databases: one with the extension, one without, one with the old
// 0.1.0, and drops them at the end.
const testDB = "idem_go_test"

var testPool *pgxpool.Pool

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, "")
	if err != nil {
		fmt.Fprintf(os.Stderr, "these tests need a PostgreSQL server with the idempotency extension installed, reached through libpq's environment (PGHOST, PGPORT, PGUSER a superuser, PGDATABASE): %v\n", err)
		return 1
	}
	defer admin.Close(ctx)
	dbs := map[string]string{
		testDB:            "CREATE EXTENSION idempotency",
		testDB + "_noext": "",
		testDB + "_old":   "CREATE EXTENSION idempotency VERSION '0.1.0'",
	}
	for name, setup := range dbs {
		for _, sql := range []string{"DROP DATABASE IF EXISTS " + name + " WITH (FORCE)", "CREATE DATABASE " + name} {
			if _, err := admin.Exec(ctx, sql); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", sql, err)
				return 1
			}
		}
		defer admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		if setup != "" {
			pool, err := openPool(ctx, name, nil)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			_, err = pool.Exec(ctx, setup)
			pool.Close()
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s in %s: %v\n", setup, name, err)
				return 1
			}
		}
	}
	testPool, err = openPool(ctx, testDB, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := testPool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, scope text, note text)`); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	testPool.Close()
	return code
}

// openPool connects to database name with libpq's environment; edit
// changes the configuration first
func openPool(ctx context.Context, name string, edit func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 8
	if edit != nil {
		edit(cfg)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// reset empties the records and the effects
func reset(t *testing.T) {
	t.Helper()
	if _, err := testPool.Exec(context.Background(), "TRUNCATE idem_keys, effects"); err != nil {
		t.Fatal(err)
	}
}

// count runs a count(*) query
func count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := testPool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func effects(t *testing.T) int { return count(t, "SELECT count(*) FROM effects") }

func TestVersionCheck(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		db    string
		found string // "ok" when New succeeds
	}{
		{testDB, "ok"},
		{testDB + "_noext", ""},
		{testDB + "_old", "0.1.0"},
	}
	for _, tt := range tests {
		t.Run(tt.db, func(t *testing.T) {
			pool, err := openPool(ctx, tt.db, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			_, err = New(ctx, pool)
			if tt.found == "ok" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ve *VersionError
			if !errors.As(err, &ve) || ve.Found != tt.found {
				t.Fatalf("New: %v; want a VersionError finding %q", err, tt.found)
			}
			if tt.found != "" && !strings.Contains(err.Error(), tt.found) || !strings.Contains(err.Error(), "0.2.0") {
				t.Fatalf("the message must name the version found and the one needed: %v", err)
			}
		})
	}
	for name, bad := range map[string]Option{
		"a JSON Pointer without a slash":      WithFingerprint("no-slash"),
		"a negative ttl":                      WithTTL(-time.Second),
		"a ttl under PostgreSQL's resolution": WithTTL(time.Nanosecond),
		"an empty operation":                  WithOperation(""),
		"a status that is not HTTP":           WithProblem(CodeRetry, Problem{Status: 99}),
		"a negative Retry-After":              WithRetryAfter(-1),
		"no final errors function":            WithFinalErrors(nil),
		"no error handler":                    WithErrorHandler(nil),
		"a negative acquire timeout":          WithAcquireTimeout(-time.Second),
		"a negative time limit":               WithTimeLimit(-time.Second),
		"a negative body limit":               WithBodyLimit(-1),
		"a negative response limit":           WithResponseLimit(-1),
	} {
		if _, err := New(ctx, testPool, bad); err == nil {
			t.Errorf("New accepted %s", name)
		}
	}
}
