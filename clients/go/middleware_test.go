package idempotency

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// bearer is the tests' scope function: the token is the account
func bearer(r *http.Request) (string, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return token, ok && token != ""
}

func newClient(t *testing.T, pool *pgxpool.Pool, opts ...Option) *Client {
	t.Helper()
	c, err := New(context.Background(), pool, append([]Option{WithScope(bearer), WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// effectHandler inserts one effect in the key's transaction and answers
// status with a JSON body and a Location; calls counts its runs
type effectHandler struct {
	status int
	calls  atomic.Int32
	sleep  time.Duration
}

func (h *effectHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	ctx := r.Context()
	scope, _ := bearer(r)
	body, _ := io.ReadAll(r.Body)
	var id int64
	if err := Tx(ctx).QueryRow(ctx, "INSERT INTO effects (scope, note) VALUES ($1, $2) RETURNING id", scope, string(body)).Scan(&id); err != nil {
		panic(err)
	}
	time.Sleep(h.sleep)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/effects/"+itoa(id))
	w.Header().Set("X-Not-Replayed", "1")
	status := h.status
	if status == 0 {
		status = 201
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"id":` + itoa(id) + `,"ok":true}`))
}

func itoa(n int64) string { return strings.TrimSpace(strings.Replace(jsonString(n), `"`, "", -1)) }

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// req is one request of a test
type req struct {
	method string
	path   string
	keys   []string // Idempotency-Key fields
	token  string   // "" for none
	ctype  string
	body   string
}

func (q req) do(h http.Handler) *httptest.ResponseRecorder {
	method, path, ctype := q.method, q.path, q.ctype
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/payments"
	}
	if ctype == "" {
		ctype = "application/json"
	}
	r := httptest.NewRequest(method, path, strings.NewReader(q.body))
	r.Header.Set("Content-Type", ctype)
	for _, k := range q.keys {
		r.Header.Add("Idempotency-Key", k)
	}
	if q.token != "" {
		r.Header.Set("Authorization", "Bearer "+q.token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// post is the usual request: key k, account acct-a, a JSON body
func post(key, body string) req {
	return req{keys: []string{key}, token: "acct-a", body: body}
}

// problemCode returns the code of a problem answer
func problemCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, body %s", ct, w.Body)
	}
	var p struct {
		Type, Title, Detail, Code string
		Status                    int
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != w.Code || p.Type != ProblemTypeBase+p.Code || p.Title == "" || p.Detail == "" {
		t.Fatalf("malformed problem %s", w.Body)
	}
	return p.Code
}

// TestMapping checks every row of doc/clients.md's mapping through the
// middleware, counting the effects in the database
func TestMapping(t *testing.T) {
	ctx := context.Background()
	readOnly, err := openPool(ctx, testDB, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	})
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close()

	failing := func(sqlstate string) http.Handler {
		return HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			ctx := r.Context()
			if _, err := Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('doomed')"); err != nil {
				return err
			}
			_, err := Tx(ctx).Exec(ctx, "DO $$ BEGIN RAISE EXCEPTION 'simulated' USING ERRCODE = '"+sqlstate+"'; END $$")
			return err
		})
	}
	tests := []struct {
		name       string
		setup      func(t *testing.T, h http.Handler) func() // returns a cleanup
		pool       *pgxpool.Pool
		handler    http.Handler
		req        req
		status     int
		code       string // problem code, "" for the handler's answer
		retryAfter string
		effects    int
		replayed   bool
	}{
		{name: "missing key", req: req{token: "acct-a", body: `{}`}, status: 400, code: CodeMissingKey},
		{name: "malformed key", req: req{keys: []string{`"a\x"`}, token: "acct-a"}, status: 400, code: CodeInvalidKey},
		{name: "two key fields", req: req{keys: []string{`"a"`, `"b"`}, token: "acct-a"}, status: 400, code: CodeInvalidKey},
		{name: "a key list", req: req{keys: []string{`"a", "b"`}, token: "acct-a"}, status: 400, code: CodeInvalidKey},
		{name: "no principal", req: req{keys: []string{`"k"`}, body: `{}`}, status: 401, code: CodeUnauthenticated},
		{name: "22023: a key over 255 bytes", req: post(strings.Repeat("k", 256), `{}`), status: 400, code: CodeInvalidRequest},
		{name: "new", req: post(`"k"`, `{"a":1}`), status: 201, effects: 1},
		{name: "replay", setup: func(t *testing.T, h http.Handler) func() {
			post(`"k"`, `{"a":1}`).do(h)
			return nil
		}, req: post(`"k"`, `{"a":1}`), status: 201, effects: 1, replayed: true},
		{name: "in_progress", setup: func(t *testing.T, h http.Handler) func() {
			return holdKey(t, "POST /payments", "k", "acct-a")
		}, req: post(`"k"`, `{"a":1}`), status: 409, code: CodeInProgress, retryAfter: "1"},
		{name: "stuck", setup: func(t *testing.T, h http.Handler) func() {
			tx, _ := testPool.Begin(ctx)
			if _, err := tx.Exec(ctx, `SELECT idem_reserve('POST /payments', 'k', '{"method": "POST", "path": "/payments"}', scope => 'acct-a')`); err != nil {
				t.Fatal(err)
			}
			_ = tx.Commit(ctx)
			if _, err := testPool.Exec(ctx, "UPDATE idem_keys SET updated_at = '-infinity'"); err != nil {
				t.Fatal(err)
			}
			return nil
		}, req: post(`"k"`, ``), status: 409, code: CodeStuck, retryAfter: "1"},
		{name: "mismatch", setup: func(t *testing.T, h http.Handler) func() {
			post(`"k"`, `{"a":1}`).do(h)
			return nil
		}, req: post(`"k"`, `{"a":2}`), status: 422, code: CodeMismatch, effects: 1},
		{name: "25006: read-only", pool: readOnly, req: post(`"k"`, `{}`), status: 503, code: CodeReadOnly, retryAfter: "1"},
		{name: "40001: serialization failure", handler: failing("40001"), req: post(`"k"`, `{}`), status: 503, code: CodeRetry, retryAfter: "1"},
		{name: "40P01: deadlock", handler: failing("40P01"), req: post(`"k"`, `{}`), status: 503, code: CodeRetry, retryAfter: "1"},
		{name: "ID003 from the handler (idem_call)", handler: failing("ID003"), req: post(`"k"`, `{}`), status: 409, code: CodeInProgress, retryAfter: "1"},
		{name: "a higher envelope version", setup: func(t *testing.T, h http.Handler) func() {
			completeBySQL(t, "k", `{"method": "POST", "path": "/payments"}`, `{"v": 2, "headers": {}}`, 200)
			return nil
		}, req: post(`"k"`, ``), status: 500, code: CodeUnsupportedEnvelope},
		{name: "any other error", handler: failing("XX123"), req: post(`"k"`, `{}`), status: 500, code: CodeInternalError},
		{name: "a handler error", handler: HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			ctx := r.Context()
			_, _ = Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('doomed')")
			w.WriteHeader(201)
			return errors.New("secret internals")
		}), req: post(`"k"`, `{}`), status: 500, code: CodeInternalError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reset(t)
			pool := tt.pool
			if pool == nil {
				pool = testPool
			}
			handler := tt.handler
			if handler == nil {
				handler = &effectHandler{}
			}
			h := newClient(t, pool).Middleware(WithOperation("POST /payments"))(handler)
			if tt.setup != nil {
				if cleanup := tt.setup(t, newClient(t, testPool).Middleware(WithOperation("POST /payments"))(&effectHandler{})); cleanup != nil {
					defer cleanup()
				}
			}
			w := tt.req.do(h)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if tt.code != "" {
				if code := problemCode(t, w); code != tt.code {
					t.Fatalf("problem %q, want %q", code, tt.code)
				}
				if strings.Contains(w.Body.String(), "secret") || strings.Contains(w.Body.String(), "simulated") {
					t.Fatalf("an internal error reached the client: %s", w.Body)
				}
			}
			if got := w.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Fatalf("Retry-After %q, want %q", got, tt.retryAfter)
			}
			if got := w.Header().Get("Idempotent-Replayed") == "true"; got != tt.replayed {
				t.Fatalf("Idempotent-Replayed %v, want %v", got, tt.replayed)
			}
			if n := effects(t); n != tt.effects {
				t.Fatalf("%d effects in the database, want %d", n, tt.effects)
			}
		})
	}
	for key, message := range map[string]string{
		strings.Repeat("k", 256): `argument \"key\" is too long`,
		"chave-\xc3\xa9":         `argument \"key\" contains a character outside printable ASCII`,
	} {
		t.Run("22023 detail is the extension's message: "+message, func(t *testing.T) {
			reset(t)
			w := post(key, `{}`).do(newClient(t, testPool).Middleware()(&effectHandler{}))
			if w.Code != 400 || problemCode(t, w) != CodeInvalidRequest || !strings.Contains(w.Body.String(), message) {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
		})
	}
}

// TestRequestsTheServerRefuses: requests the middleware takes and the
// server cannot read (doc/clients.md, "Requests the server refuses") are
// 400 invalid-request with the server's message, and nothing is reserved
func TestRequestsTheServerRefuses(t *testing.T) {
	for _, tt := range []struct {
		name    string
		pool    *pgxpool.Pool
		req     req
		message string
	}{
		{"22P05: \\u0000 in a string", testPool, post("k", `{"a": "x\u0000y"}`), "unsupported Unicode escape sequence"},
		{"22P05: \\u0000 as a member name", testPool, post("k", `{"\u0000": 1}`), "unsupported Unicode escape sequence"},
		{"22P02: a lone surrogate", testPool, post("k", `{"a": "\ud800"}`), "invalid input syntax for type json"},
		{"22003: a number beyond a double", testPool, post("k", `{"a": 1e400}`), "number 1e+400 is out of range for canonical JSON"},
		{"22003: a number beyond numeric", testPool, post("k", `{"a": 1e1000000}`), "value overflows numeric format"},
		{"22021: a bare key that is not UTF-8", testPool, post("k-\xff", `{}`), `invalid byte sequence for encoding "UTF8": 0xff`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reset(t)
			h := &effectHandler{}
			w := tt.req.do(newClient(t, tt.pool).Middleware()(h))
			if w.Code != 400 || problemCode(t, w) != CodeInvalidRequest {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			var p struct{ Detail string }
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Detail != tt.message {
				t.Fatalf("detail %q, want %q (%v)", p.Detail, tt.message, err)
			}
			if n := h.calls.Load(); n != 0 {
				t.Fatalf("the handler ran %d times", n)
			}
			if n := count(t, "SELECT count(*) FROM idem_keys"); n != 0 {
				t.Fatalf("%d records, want 0", n)
			}
		})
	}
	// the nesting limit, the same in every language: 256 levels are JSON,
	// and the server takes them at its smallest stack (100kB, about 600
	// levels); a body nested deeper is its bytes
	shallow, err := openPool(context.Background(), testDB, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["max_stack_depth"] = "100kB"
	})
	if err != nil {
		t.Fatal(err)
	}
	defer shallow.Close()
	nested := func(levels int) string {
		return `{"a": ` + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`
	}
	for _, tt := range []struct {
		name string
		body string
		doc  string
	}{
		{"256 levels are JSON", nested(256), `{"method": "POST", "path": "/payments", "body": ` + nested(256) + `}`},
		{"257 levels are bytes", nested(257), `{"method": "POST", "path": "/payments", "body_base64": "` + base64.StdEncoding.EncodeToString([]byte(nested(257))) + `"}`},
		{"12000 levels are bytes", nested(12000), `{"method": "POST", "path": "/payments", "body_base64": "` + base64.StdEncoding.EncodeToString([]byte(nested(12000))) + `"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reset(t)
			if w := post("k", tt.body).do(newClient(t, shallow).Middleware()(&effectHandler{})); w.Code != 201 {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			if n := count(t, "SELECT count(*) FROM idem_keys WHERE request_hash = idem_hash($1::jsonb)", tt.doc); n != 1 {
				t.Fatalf("%d records of that document, want 1", n)
			}
		})
	}
	for _, state := range []string{"22P02", "22P05", "22003", "22021", "54001"} {
		t.Run(state+" from the handler's own SQL, rolled back", func(t *testing.T) {
			reset(t)
			h := HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				ctx := r.Context()
				if _, err := Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('doomed')"); err != nil {
					return err
				}
				_, err := Tx(ctx).Exec(ctx, "DO $$ BEGIN RAISE EXCEPTION 'secret text' USING ERRCODE = '"+state+"'; END $$")
				return err
			})
			w := post("k", `{}`).do(newClient(t, testPool).Middleware()(h))
			if w.Code != 400 || problemCode(t, w) != CodeInvalidRequest || !strings.Contains(w.Body.String(), `"secret text"`) {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			if n := effects(t) + count(t, "SELECT count(*) FROM idem_keys"); n != 0 {
				t.Fatalf("%d effects and records, want 0", n)
			}
		})
	}
}

// holdKey reserves a key in a transaction left open until the cleanup
func holdKey(t *testing.T, op, key, scope string) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := testPool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var outcome string
	if err := tx.QueryRow(ctx, "SELECT outcome FROM idem_reserve($1, $2, NULL, scope => $3)", op, key, scope).Scan(&outcome); err != nil || outcome != "new" {
		t.Fatalf("holdKey: %s %v", outcome, err)
	}
	return func() { _ = tx.Rollback(ctx) }
}

// completeBySQL writes a completed record as plain SQL (or another
// language's library) would, for operation "POST /payments" and acct-a
func completeBySQL(t *testing.T, key, document, response string, status int) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, testPool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT idem_reserve('POST /payments', $1, $2::jsonb, scope => 'acct-a')", key, document); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT idem_complete('POST /payments', $1, $2::jsonb, $3, scope => 'acct-a')", key, response, status)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCustomMapping(t *testing.T) {
	reset(t)
	defer holdKey(t, "POST /payments", "k", "acct-a")()
	c := newClient(t, testPool, WithRetryAfter(7))
	h := c.Middleware(WithProblem(CodeInProgress, Problem{Status: 429, Title: "Busy", Detail: "Busy.", RetryAfter: true}))(&effectHandler{})
	w := post("k", ``).do(h)
	if w.Code != 429 || w.Header().Get("Retry-After") != "7" || problemCode(t, w) != CodeInProgress {
		t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
	}
	// the client's own mapping is unchanged
	w = post("k", ``).do(c.Middleware()(&effectHandler{}))
	if w.Code != 409 || w.Header().Get("Retry-After") != "7" {
		t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
	}
}

func TestRetryableStatusRollsBack(t *testing.T) {
	reset(t)
	c := newClient(t, testPool)
	failing := &effectHandler{status: 503}
	w := post("k", `{"a":1}`).do(c.Middleware()(failing))
	if w.Code != 503 || w.Header().Get("Location") == "" {
		t.Fatalf("the handler's own answer goes to the client: %d %s", w.Code, w.Body)
	}
	if n := effects(t); n != 0 {
		t.Fatalf("%d effects after a 503, want 0", n)
	}
	if n := count(t, "SELECT count(*) FROM idem_keys"); n != 0 {
		t.Fatalf("%d records after a 503, want 0", n)
	}
	ok := &effectHandler{}
	w = post("k", `{"a":1}`).do(c.Middleware()(ok))
	if w.Code != 201 || ok.calls.Load() != 1 || effects(t) != 1 {
		t.Fatalf("the retry must be new: %d, %d calls, %d effects", w.Code, ok.calls.Load(), effects(t))
	}
	// the user's list: 402 rolls back too, 503 is final
	reset(t)
	h := c.Middleware(WithRetryable(func(s int) bool { return s == 402 }))
	if w = post("k2", `{}`).do(h(&effectHandler{status: 402})); w.Code != 402 || effects(t) != 0 {
		t.Fatalf("402 marked retryable: %d, %d effects", w.Code, effects(t))
	}
	if w = post("k3", `{}`).do(h(&effectHandler{status: 503})); w.Code != 503 || effects(t) != 1 {
		t.Fatalf("503 marked final: %d, %d effects", w.Code, effects(t))
	}
}

func TestFinalFailureCompleted(t *testing.T) {
	reset(t)
	h := &effectHandler{status: 402}
	mw := newClient(t, testPool).Middleware()(h)
	first := post("k", `{"amount": 2000000}`).do(mw)
	second := post("k", `{"amount": 2000000}`).do(mw)
	if first.Code != 402 || second.Code != 402 || second.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%d, %d %v", first.Code, second.Code, second.Header())
	}
	if !jsonEqual(t, first.Body.Bytes(), second.Body.Bytes()) {
		t.Fatalf("replayed %s, first %s", second.Body, first.Body)
	}
	if h.calls.Load() != 1 || effects(t) != 1 || count(t, "SELECT count(*) FROM idem_keys WHERE status = 'completed' AND response_status = 402") != 1 {
		t.Fatalf("%d calls, %d effects", h.calls.Load(), effects(t))
	}
}

func TestScope(t *testing.T) {
	reset(t)
	h := &effectHandler{}
	mw := newClient(t, testPool).Middleware()(h)
	a := req{keys: []string{"shared"}, token: "acct-a", body: `{"x":1}`}
	b := req{keys: []string{"shared"}, token: "acct-b", body: `{"x":1}`}
	wa := a.do(mw)
	wb := b.do(mw)
	if wa.Code != 201 || wb.Code != 201 || wb.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("user B must not replay user A's key: %d %d %v", wa.Code, wb.Code, wb.Header())
	}
	if wb.Body.String() == wa.Body.String() {
		t.Fatalf("user B got user A's answer: %s", wb.Body)
	}
	// and B cannot block A: A's retry replays A's answer
	wa2 := a.do(mw)
	if !jsonEqual(t, wa2.Body.Bytes(), wa.Body.Bytes()) || wa2.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("A's retry: %s", wa2.Body)
	}
	if h.calls.Load() != 2 || count(t, "SELECT count(DISTINCT scope) FROM effects") != 2 || effects(t) != 2 {
		t.Fatalf("%d calls, %d effects", h.calls.Load(), effects(t))
	}
	// a header the client chooses is no scope
	c := req{keys: []string{"other"}, body: `{}`}
	if w := c.do(mw); w.Code != 401 {
		t.Fatalf("no principal: %d", w.Code)
	}
}

func TestKeyForms(t *testing.T) {
	reset(t)
	h := &effectHandler{}
	mw := newClient(t, testPool).Middleware()(h)
	for i, key := range []string{`"ab\"c"`, `ab"c`, ` "ab\"c" `} {
		w := post(key, `{"a":1}`).do(mw)
		if w.Code != 201 || (i > 0) != (w.Header().Get("Idempotent-Replayed") == "true") {
			t.Fatalf("%s: %d %v", key, w.Code, w.Header())
		}
	}
	if h.calls.Load() != 1 || count(t, `SELECT count(*) FROM idem_keys WHERE key = 'ab"c'`) != 1 {
		t.Fatalf("a quoted and a bare key are one key: %d calls", h.calls.Load())
	}
}

func TestFingerprint(t *testing.T) {
	reset(t)
	h := &effectHandler{}
	c := newClient(t, testPool)
	whole := c.Middleware(WithOperation("fixed"))(h)
	// member order and number spelling do not change the fingerprint
	if w := post("w", `{"a": 1, "b": [1.0, "x"]}`).do(whole); w.Code != 201 {
		t.Fatal(w.Code)
	}
	if w := post("w", `{"b":[1,"x"],"a":1.00}`).do(whole); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if w := post("w", `{"a": 1, "b": [1, "y"]}`).do(whole); w.Code != 422 {
		t.Fatalf("another body: %d", w.Code)
	}
	// the path is part of it, the query string is not
	if w := (req{path: "/payments?x=1", keys: []string{"w"}, token: "acct-a", body: `{"a":1,"b":[1,"x"]}`}).do(whole); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("query string: %d", w.Code)
	}
	if w := (req{path: "/other", keys: []string{"w"}, token: "acct-a", body: `{"a":1,"b":[1,"x"]}`}).do(whole); w.Code != 422 {
		t.Fatalf("another path: %d", w.Code)
	}
	// a non-JSON body is fingerprinted by its bytes
	if w := (req{keys: []string{"t"}, token: "acct-a", ctype: "text/plain", body: "hello"}).do(whole); w.Code != 201 {
		t.Fatal(w.Code)
	}
	if w := (req{keys: []string{"t"}, token: "acct-a", ctype: "text/plain", body: "hello!"}).do(whole); w.Code != 422 {
		t.Fatalf("other bytes: %d", w.Code)
	}

	subset := c.Middleware(WithFingerprint("/order_id", "/amount"))(h)
	if w := post("s", `{"order_id": "o-1", "amount": 100, "note": "first"}`).do(subset); w.Code != 201 {
		t.Fatal(w.Code)
	}
	if w := post("s", `{"amount": 100, "order_id": "o-1", "note": "second"}`).do(subset); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a member outside the subset changed the fingerprint: %d", w.Code)
	}
	if w := post("s", `{"order_id": "o-1", "amount": 101, "note": "first"}`).do(subset); w.Code != 422 {
		t.Fatalf("a member of the subset: %d", w.Code)
	}
	if w := (req{keys: []string{"s2"}, token: "acct-a", ctype: "text/plain", body: "x"}).do(subset); w.Code != 400 || problemCode(t, w) != CodeInvalidRequest {
		t.Fatalf("a subset on a non-JSON body: %d %s", w.Code, w.Body)
	}
	// the stored document is the one doc/clients.md shows
	if n := count(t, `SELECT count(*) FROM idem_keys WHERE key = 's' AND request_hash = idem_hash('{"method": "POST", "path": "/payments", "body": {"/amount": 100, "/order_id": "o-1"}}')`); n != 1 {
		t.Fatal("the subset's request document is not the documented one")
	}
}

func TestEnvelopeReplay(t *testing.T) {
	reset(t)
	c := newClient(t, testPool)
	t.Run("allow-listed headers", func(t *testing.T) {
		h := &effectHandler{}
		mw := c.Middleware(WithReplayHeaders("X-Request-Tag"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Tag", "t1")
			h.ServeHTTP(w, r)
		}))
		first := post("h", `{}`).do(mw)
		second := post("h", `{}`).do(mw)
		for _, name := range []string{"Location", "Content-Type", "X-Request-Tag"} {
			if second.Header().Get(name) == "" || second.Header().Get(name) != first.Header().Get(name) {
				t.Fatalf("%s: replayed %q, first %q", name, second.Header().Get(name), first.Header().Get(name))
			}
		}
		if second.Header().Get("X-Not-Replayed") != "" || first.Header().Get("X-Not-Replayed") != "1" {
			t.Fatalf("a header off the allow-list was replayed")
		}
	})
	t.Run("non-JSON body", func(t *testing.T) {
		body := "line one\n\x00\xff binary"
		n := 0
		mw := c.Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n++
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, body)
		}))
		post("b", `{}`).do(mw)
		w := post("b", `{}`).do(mw)
		if w.Body.String() != body || n != 1 || w.Header().Get("Content-Type") != "application/octet-stream" {
			t.Fatalf("replayed %q (%d runs)", w.Body, n)
		}
		if count(t, `SELECT count(*) FROM idem_keys WHERE key = 'b' AND response ? 'body_base64' AND response->'v' = '1'`) != 1 {
			t.Fatal("the body is not stored as body_base64 in a v 1 envelope")
		}
	})
	t.Run("a record completed by plain SQL", func(t *testing.T) {
		completeBySQL(t, "plain", `{"method": "POST", "path": "/payments"}`, `{"id": 7, "status": "paid"}`, 201)
		w := post("plain", ``).do(c.Middleware(WithOperation("POST /payments"))(&effectHandler{}))
		if w.Code != 201 || w.Header().Get("Content-Type") != "application/json" || !jsonEqual(t, w.Body.Bytes(), []byte(`{"id": 7, "status": "paid"}`)) {
			t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
		}
	})
	t.Run("another language's envelope", func(t *testing.T) {
		completeBySQL(t, "other", `{"method": "POST", "path": "/payments", "body": {"a": 1}}`,
			`{"v": 1, "headers": {"content-type": "text/csv", "location": "/x/1"}, "body_base64": "YSxiCjEsMgo="}`, 200)
		w := post("other", `{"a":1}`).do(c.Middleware(WithOperation("POST /payments"))(&effectHandler{}))
		if w.Code != 200 || w.Header().Get("Content-Type") != "text/csv" || w.Header().Get("Location") != "/x/1" || w.Body.String() != "a,b\n1,2\n" {
			t.Fatalf("%d %v %q", w.Code, w.Header(), w.Body)
		}
	})
}

func TestDefaultOperation(t *testing.T) {
	reset(t)
	c := newClient(t, testPool)
	router := chi.NewRouter()
	router.With(c.Middleware()).Post("/items/{id}", (&effectHandler{}).ServeHTTP)
	router.Route("/shops/{shop}", func(r chi.Router) {
		r.With(c.Middleware()).Patch("/orders/{order}", (&effectHandler{}).ServeHTTP)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /things/{id}", c.Middleware()(&effectHandler{}))
	outerMux := http.NewServeMux()
	outerMux.Handle("/", &effectHandler{})
	outer := c.Middleware()(outerMux) // before routing: the request's path
	tests := []struct {
		h      http.Handler
		method string
		path   string
		want   string
	}{
		{router, "POST", "/items/42", "POST /items/{id}"},
		{router, "PATCH", "/shops/s1/orders/o1", "PATCH /shops/{shop}/orders/{order}"},
		{mux, "POST", "/things/9", "POST /things/{id}"},
		{outer, "POST", "/raw/5", "POST /raw/5"},
	}
	for _, tt := range tests {
		w := req{method: tt.method, path: tt.path, keys: []string{"op-" + tt.path}, token: "acct-a", body: `{}`}.do(tt.h)
		if w.Code != 201 {
			t.Fatalf("%s %s: %d %s", tt.method, tt.path, w.Code, w.Body)
		}
		if n := count(t, "SELECT count(*) FROM idem_keys WHERE key = $1 AND operation = $2", "op-"+tt.path, tt.want); n != 1 {
			var got string
			_ = testPool.QueryRow(context.Background(), "SELECT operation FROM idem_keys WHERE key = $1", "op-"+tt.path).Scan(&got)
			t.Fatalf("%s %s: operation %q, want %q", tt.method, tt.path, got, tt.want)
		}
	}
}

func TestKeyOptionalAndMethods(t *testing.T) {
	reset(t)
	c := newClient(t, testPool)
	var sawTx bool
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawTx = Tx(r.Context()) != nil
		w.WriteHeader(200)
	})
	if w := (req{token: "acct-a", body: `{}`}).do(c.Middleware(WithKeyOptional())(plain)); w.Code != 200 || sawTx {
		t.Fatalf("an optional key: %d, tx %v", w.Code, sawTx)
	}
	if w := (req{method: "GET", keys: []string{"g"}, token: "acct-a"}).do(c.Middleware()(plain)); w.Code != 200 || sawTx {
		t.Fatalf("GET: %d, tx %v", w.Code, sawTx)
	}
	if w := (req{method: "PUT", keys: []string{"p"}, token: "acct-a"}).do(c.Middleware(WithMethods("PUT"))(plain)); w.Code != 200 || !sawTx {
		t.Fatalf("PUT made idempotent: %d, tx %v", w.Code, sawTx)
	}
	if n := count(t, "SELECT count(*) FROM idem_keys"); n != 1 {
		t.Fatalf("%d records, want 1 (the PUT)", n)
	}
}

func TestMiddlewareNeedsScope(t *testing.T) {
	c, err := New(context.Background(), testPool)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if v := recover(); v == nil || !strings.Contains(jsonString(v), "scope") {
			t.Fatalf("a middleware without a scope function must not start: %v", v)
		}
	}()
	c.Middleware()
}

func TestAbortHandlerRollsBack(t *testing.T) {
	reset(t)
	h := newClient(t, testPool).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = Tx(r.Context()).Exec(r.Context(), "INSERT INTO effects (note) VALUES ('x')")
		panic(http.ErrAbortHandler)
	}))
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		post("k", `{}`).do(h)
	}()
	if effects(t) != 0 || count(t, "SELECT count(*) FROM idem_keys") != 0 {
		t.Fatal("an aborted handler left rows")
	}
}

// TestDisconnect: the client hangs up while the handler runs; the effect
// still commits with its record, and the retry replays
func TestDisconnect(t *testing.T) {
	reset(t)
	h := &effectHandler{sleep: 700 * time.Millisecond}
	var handlerCtxErr atomic.Value
	mw := newClient(t, testPool).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		handlerCtxErr.Store(jsonString(r.Context().Err()))
	}))
	srv := httptest.NewServer(mw)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/payments", strings.NewReader(`{"a":1}`))
	r.Header.Set("Idempotency-Key", `"drop"`)
	r.Header.Set("Authorization", "Bearer acct-a")
	r.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(r); err == nil {
		resp.Body.Close()
		t.Fatal("the client was meant to give up before the answer")
	}
	deadline := time.Now().Add(10 * time.Second)
	for count(t, "SELECT count(*) FROM idem_keys WHERE key = 'drop' AND status = 'completed'") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request was not committed after the client went away")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if effects(t) != 1 || handlerCtxErr.Load() != "null" {
		t.Fatalf("%d effects, the handler's context: %v", effects(t), handlerCtxErr.Load())
	}
	w := post(`"drop"`, `{"a":1}`).do(mw)
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || h.calls.Load() != 1 {
		t.Fatalf("the retry: %d %v, %d runs", w.Code, w.Header(), h.calls.Load())
	}
}

// TestAnswerAfterCommit: the client gets the answer only once the effect
// is committed, even when the handler writes and tries to flush early
func TestAnswerAfterCommit(t *testing.T) {
	reset(t)
	mw := newClient(t, testPool).Middleware()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = Tx(r.Context()).Exec(r.Context(), "INSERT INTO effects (note) VALUES ('x')")
		w.WriteHeader(201)
		_, _ = io.WriteString(w, "done")
		if err := http.NewResponseController(w).Flush(); err == nil {
			t.Error("the middleware's writer flushed before COMMIT")
		}
		time.Sleep(300 * time.Millisecond)
	}))
	srv := httptest.NewServer(mw)
	defer srv.Close()
	r, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "after")
	r.Header.Set("Authorization", "Bearer acct-a")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if n := effects(t); resp.StatusCode != 201 || n != 1 {
		t.Fatalf("the answer (%d) came before the commit: %d effects visible", resp.StatusCode, n)
	}
}

// TestConcurrentDuplicates: many requests with one key at once make one
// effect
func TestConcurrentDuplicates(t *testing.T) {
	reset(t)
	h := &effectHandler{sleep: 200 * time.Millisecond}
	mw := newClient(t, testPool).Middleware()(h)
	var wg sync.WaitGroup
	codes := make(chan int, 12)
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- post("storm", `{"a":1}`).do(mw).Code
		}()
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 201 && code != 409 {
			t.Fatalf("status %d", code)
		}
	}
	if h.calls.Load() != 1 || effects(t) != 1 {
		t.Fatalf("%d runs, %d effects; want 1", h.calls.Load(), effects(t))
	}
}

// TestQueryExecModes: the SQL works in every pgx mode, PgBouncer's
// (cache_describe, exec, simple_protocol) included
func TestQueryExecModes(t *testing.T) {
	modes := map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"cache_describe":  pgx.QueryExecModeCacheDescribe,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
		"exec":            pgx.QueryExecModeExec,
		"simple_protocol": pgx.QueryExecModeSimpleProtocol,
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			reset(t)
			pool, err := openPool(context.Background(), testDB, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			mw := newClient(t, pool, WithTTL(time.Hour)).Middleware()(&effectHandler{})
			codes := []int{post("m", `{"a":1}`).do(mw).Code, post("m", `{"a":1}`).do(mw).Code, post("m", `{"a":2}`).do(mw).Code,
				(req{keys: []string{"t"}, token: "acct-a", ctype: "text/plain", body: "x"}).do(mw).Code}
			if codes[0] != 201 || codes[1] != 201 || codes[2] != 422 || codes[3] != 201 || effects(t) != 2 {
				t.Fatalf("%v, %d effects", codes, effects(t))
			}
			if n := count(t, "SELECT count(*) FROM idem_keys WHERE expires_at - updated_at BETWEEN '59 minutes' AND '61 minutes'"); n != 2 {
				t.Fatalf("the ttl: %d records with an hour", n)
			}
		})
	}
}

func TestBeginFunc(t *testing.T) {
	reset(t)
	ctx := context.Background()
	c := newClient(t, testPool)
	r := Request{Operation: "charge", Scope: "acct-a", Key: "b1", Document: []byte(`{"amount": 5}`)}
	runs := 0
	fn := func(ctx context.Context, tx pgx.Tx) (Response, error) {
		runs++
		if _, err := tx.Exec(ctx, "INSERT INTO effects (note) VALUES ('b')"); err != nil {
			return Response{}, err
		}
		return Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"n": 1}`)}, nil
	}
	res, err := c.BeginFunc(ctx, r, fn)
	if err != nil || res.Outcome != OutcomeNew || !res.Committed {
		t.Fatalf("%+v %v", res, err)
	}
	res, err = c.BeginFunc(ctx, r, fn)
	if err != nil || res.Outcome != OutcomeReplay || string(res.Response.Body) != `{"n": 1}` || runs != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	other := r
	other.Document = []byte(`{"amount": 6}`)
	if _, err := c.BeginFunc(ctx, other, fn); !errors.Is(err, ErrMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	func() {
		defer holdKey(t, "charge", "held", "acct-a")()
		held := r
		held.Key = "held"
		if _, err := c.BeginFunc(ctx, held, fn); !errors.Is(err, ErrInProgress) {
			t.Fatalf("in progress: %v", err)
		}
	}()
	// an error rolls back the effect and the record
	boom := errors.New("boom")
	failed := r
	failed.Key = "b2"
	if _, err := c.BeginFunc(ctx, failed, func(ctx context.Context, tx pgx.Tx) (Response, error) {
		_, _ = fn(ctx, tx)
		return Response{}, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("%v", err)
	}
	if effects(t) != 1 || count(t, "SELECT count(*) FROM idem_keys WHERE key = 'b2'") != 0 {
		t.Fatal("an error left rows")
	}
	// cancelling the context once fn has returned does not roll back
	cctx, cancel := context.WithCancel(ctx)
	late := r
	late.Key = "b3"
	res, err = c.BeginFunc(cctx, late, func(ctx context.Context, tx pgx.Tx) (Response, error) {
		resp, err := fn(ctx, tx)
		cancel()
		return resp, err
	})
	if err != nil || !res.Committed || count(t, "SELECT count(*) FROM idem_keys WHERE key = 'b3' AND status = 'completed'") != 1 {
		t.Fatalf("cancelled after the handler: %+v %v", res, err)
	}
}
