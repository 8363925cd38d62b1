package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The demo's tests run against a real PostgreSQL with the extension
// installed (libpq's environment, PGUSER a superuser): TestMain creates a
// database with the extension and clients/demo/schema.sql, and the app
// connects as the role that schema creates, idem_demo_app.
const demoDB = "idem_go_demo_test"

var (
	testApp  *app
	adminDB  *pgxpool.Pool
	handlers http.Handler
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, "")
	if err != nil {
		fmt.Fprintf(os.Stderr, "these tests need a PostgreSQL server with the idempotency extension installed, through libpq's environment: %v\n", err)
		return 1
	}
	defer admin.Close(ctx)
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + demoDB + " WITH (FORCE)", "CREATE DATABASE " + demoDB} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			fmt.Fprintln(os.Stderr, sql, err)
			return 1
		}
	}
	defer admin.Exec(ctx, "DROP DATABASE IF EXISTS "+demoDB+" WITH (FORCE)")
	schema, err := os.ReadFile("../../demo/schema.sql")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	adminDB, err = pool(ctx, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer adminDB.Close()
	for _, sql := range []string{"CREATE EXTENSION idempotency", string(schema),
		"CREATE TABLE bench_effects (id bigserial PRIMARY KEY, k text)",
		"GRANT SELECT, INSERT ON bench_effects TO idem_demo_app",
		"GRANT USAGE ON SEQUENCE bench_effects_id_seq TO idem_demo_app"} {
		if _, err := adminDB.Exec(ctx, sql); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	appPool, err := pool(ctx, "idem_demo_app")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer appPool.Close()
	testApp, err = newApp(ctx, appPool, slog.New(slog.NewTextHandler(io.Discard, nil)), true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	handlers = testApp.routes(true)
	return m.Run()
}

func pool(ctx context.Context, user string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Database = demoDB
	if user != "" {
		cfg.ConnConfig.User = user
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := adminDB.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func call(method, path, token, key, body string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	handlers.ServeHTTP(w, r)
	return w
}

func code(w *httptest.ResponseRecorder) string {
	var p struct{ Code string }
	_ = json.Unmarshal(w.Body.Bytes(), &p)
	return p.Code
}

func TestPayments(t *testing.T) {
	pay := `{"order_id": "o-1", "amount": 100, "currency": "EUR"}`
	first := call("POST", "/payments", "token-a", `"p1"`, pay)
	if first.Code != 201 || !strings.HasPrefix(first.Header().Get("Location"), "/payments/") {
		t.Fatalf("%d %v %s", first.Code, first.Header(), first.Body)
	}
	var p payment
	if err := json.Unmarshal(first.Body.Bytes(), &p); err != nil || p.Status != "paid" || p.OrderID != "o-1" || p.Amount != 100 || p.Currency != "EUR" || p.ID == 0 {
		t.Fatalf("%s %v", first.Body, err)
	}
	again := call("POST", "/payments", "token-a", `p1`, `{"currency": "EUR", "amount": 100, "order_id": "o-1"}`)
	if again.Code != 201 || again.Header().Get("Idempotent-Replayed") != "true" || again.Header().Get("Location") != first.Header().Get("Location") {
		t.Fatalf("the replay: %d %v", again.Code, again.Header())
	}
	if n := count(t, "SELECT count(*) FROM payments WHERE order_id = 'o-1'"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
	tests := []struct {
		name, token, key, body string
		status                 int
		code                   string
	}{
		{"another body", "token-a", "p1", `{"order_id": "o-2", "amount": 100, "currency": "EUR"}`, 422, "mismatch"},
		{"account b with a's key", "token-b", "p1", pay, 201, ""},
		{"no key", "token-a", "", pay, 400, "missing-key"},
		{"unknown token", "token-x", "p9", pay, 401, "unauthenticated"},
		{"not a payment", "token-a", "bad", `{"order_id": "o-3", "amount": -1, "currency": "EUR"}`, 400, "bad-request"},
		{"not a payment, again", "token-a", "bad", `{"order_id": "o-3", "amount": -1, "currency": "EUR"}`, 400, "bad-request"},
		{"declined", "token-a", "big", `{"order_id": "o-4", "amount": 1000001, "currency": "EUR"}`, 402, "card-declined"},
		{"declined, again", "token-a", "big", `{"order_id": "o-4", "amount": 1000001, "currency": "EUR"}`, 402, "card-declined"},
	}
	for _, tt := range tests {
		w := call("POST", "/payments", tt.token, tt.key, tt.body)
		if w.Code != tt.status || code(w) != tt.code {
			t.Fatalf("%s: %d %s", tt.name, w.Code, w.Body)
		}
		if strings.HasSuffix(tt.name, "again") && w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: a final answer is completed and replayed", tt.name)
		}
	}
	if n := count(t, "SELECT count(*) FROM payments WHERE order_id = 'o-4' AND status = 'declined'"); n != 1 {
		t.Fatalf("%d declined payments, want 1", n)
	}
	if n := count(t, "SELECT count(*) FROM payments WHERE order_id = 'o-1'"); n != 2 {
		t.Fatalf("%d payments of o-1 (accounts a and b), want 2", n)
	}

	// GET: the caller's own payment only
	loc := first.Header().Get("Location")
	if w := call("GET", loc, "token-a", "", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"o-1"`) {
		t.Fatalf("GET own: %d %s", w.Code, w.Body)
	}
	if w := call("GET", loc, "token-b", "", ""); w.Code != 404 {
		t.Fatalf("GET another account's: %d", w.Code)
	}
	if w := call("GET", loc, "", "", ""); w.Code != 401 {
		t.Fatalf("GET without a token: %d", w.Code)
	}
	if w := call("GET", "/payments/x", "token-a", "", ""); w.Code != 404 {
		t.Fatalf("GET a bad id: %d", w.Code)
	}
}

func TestSimulatedLatency(t *testing.T) {
	w := call("POST", "/payments", "token-a", "slow", `{"order_id": "o-s", "amount": 5, "currency": "USD"}`, "X-Simulated-Latency-Ms", "50")
	if w.Code != 201 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if w := call("POST", "/payments", "token-a", "slow2", `{"order_id": "o-s", "amount": 5, "currency": "USD"}`, "X-Simulated-Latency-Ms", "soon"); w.Code != 400 {
		t.Fatalf("a bad latency: %d", w.Code)
	}
}

func TestBenchRoutes(t *testing.T) {
	for _, path := range []string{"/bench/middleware", "/bench/by-hand"} {
		key := "bench" + path
		first := call("POST", path, "token-a", key, `{"n": 1}`)
		second := call("POST", path, "token-a", key, `{"n": 1}`)
		if first.Code != 201 || second.Code != 201 || second.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: %d %d %v", path, first.Code, second.Code, second.Header())
		}
		if n := count(t, "SELECT count(*) FROM bench_effects WHERE k = $1", key); n != 1 {
			t.Fatalf("%s: %d effects", path, n)
		}
	}
}

func TestTokens(t *testing.T) {
	got := parseTokens(" t1=a1, t2=a2,broken,=x")
	if len(got) != 2 || got["t1"] != "a1" || got["t2"] != "a2" {
		t.Fatalf("%v", got)
	}
	if d := parseTokens(""); d["token-a"] != "acct-a" || d["token-b"] != "acct-b" {
		t.Fatalf("%v", d)
	}
}
