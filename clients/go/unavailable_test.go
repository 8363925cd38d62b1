package idempotency

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// refusedDB checks the version on the test server and begins its
// transactions on a pool whose server is gone: a loopback port nobody
// listens on (connection refused)
type refusedDB struct{ refused *pgxpool.Pool }

func (d refusedDB) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return d.refused.BeginTx(ctx, o)
}

func (d refusedDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return testPool.QueryRow(ctx, sql, args...)
}

// terminateOwnBackend ends the server process of the handler's
// transaction from another connection, and waits until it is gone
func terminateOwnBackend(t *testing.T, r *http.Request) {
	pid := Tx(r.Context()).Conn().PgConn().PID()
	var ok bool
	if err := testPool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1, 10000)", pid).Scan(&ok); err != nil || !ok {
		t.Errorf("pg_terminate_backend: %v %v", ok, err)
	}
}

// TestDatabaseGoingAway: a database that cannot be reached, or a connection
// lost before COMMIT, is 503 unavailable with Retry-After, nothing kept,
// and the retry runs again once the database is back
func TestDatabaseGoingAway(t *testing.T) {
	ctx := context.Background()
	unavailable := func(t *testing.T, w *httptest.ResponseRecorder) {
		t.Helper()
		if w.Code != 503 || w.Header().Get("Retry-After") != "1" || problemCode(t, w) != CodeUnavailable {
			t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
		}
	}
	t.Run("the pool cannot connect", func(t *testing.T) {
		reset(t)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		refused, err := openPool(ctx, testDB, func(c *pgxpool.Config) {
			c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", uint16(port)
			c.ConnConfig.Fallbacks = nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer refused.Close()
		c, err := New(ctx, refusedDB{refused}, WithScope(bearer), WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		h := &effectHandler{}
		w := post("k", `{}`).do(c.Middleware()(h))
		unavailable(t, w)
		if h.calls.Load() != 0 {
			t.Fatalf("%s, %d runs", w.Body, h.calls.Load())
		}
		if _, err := c.BeginFunc(ctx, Request{Operation: "o", Key: "k"}, func(context.Context, pgx.Tx) (Response, error) {
			return Response{Status: 200}, nil
		}); !connectionLost(err) {
			t.Fatalf("BeginFunc: %v", err)
		}
	})
	c := newClient(t, testPool)
	for name, handler := range map[string]func(h *effectHandler) http.Handler{
		"lost in the handler, which returns the error": func(h *effectHandler) http.Handler {
			return HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				h.calls.Add(1)
				ctx := r.Context()
				if _, err := Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('lost')"); err != nil {
					return err
				}
				if h.calls.Load() == 1 {
					terminateOwnBackend(t, r)
				}
				if _, err := Tx(ctx).Exec(ctx, "SELECT 1"); err != nil {
					return err
				}
				w.WriteHeader(201)
				return nil
			})
		},
		"lost before COMMIT, the handler unaware": func(h *effectHandler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if h.calls.Load() == 0 {
					defer terminateOwnBackend(t, r)
				}
				h.ServeHTTP(w, r)
			})
		},
	} {
		t.Run(name, func(t *testing.T) {
			reset(t)
			h := &effectHandler{}
			mw := c.Middleware()(handler(h))
			w := post("k", `{}`).do(mw)
			unavailable(t, w)
			if effects(t)+records(t) != 0 {
				t.Fatalf("%s, %d effects, %d records", w.Body, effects(t), records(t))
			}
			if w = post("k", `{}`).do(mw); w.Code != 201 || effects(t) != 1 || h.calls.Load() != 2 {
				t.Fatalf("the retry: %d %s, %d effects, %d runs", w.Code, w.Body, effects(t), h.calls.Load())
			}
		})
	}
}

// TestAcquireDeadline: a request waits for a connection at most the
// acquire timeout (503 unavailable, nothing reserved), and a request whose
// client left while it waited does not start its handler
func TestAcquireDeadline(t *testing.T) {
	ctx := context.Background()
	one, err := openPool(ctx, testDB, func(c *pgxpool.Config) { c.MaxConns = 1 })
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	c := newClient(t, one)
	t.Run("past the acquire timeout", func(t *testing.T) {
		reset(t)
		held, err := one.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()
		h := &effectHandler{}
		start := time.Now()
		w := post("k", `{}`).do(c.Middleware(WithAcquireTimeout(300 * time.Millisecond))(h))
		if took := time.Since(start); took < 300*time.Millisecond || took > 3*time.Second {
			t.Fatalf("answered after %v", took)
		}
		if w.Code != 503 || w.Header().Get("Retry-After") != "1" || problemCode(t, w) != CodeUnavailable || h.calls.Load() != 0 || records(t) != 0 {
			t.Fatalf("%d %v %s, %d runs", w.Code, w.Header(), w.Body, h.calls.Load())
		}
	})
	t.Run("the client left while the request waited", func(t *testing.T) {
		reset(t)
		held, err := one.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := &effectHandler{}
		var inServer atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inServer.Add(1)
			c.Middleware(WithAcquireTimeout(0))(h).ServeHTTP(w, r)
		}))
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		r, _ := http.NewRequestWithContext(cctx, "POST", srv.URL+"/payments", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k")
		r.Header.Set("Authorization", "Bearer acct-a")
		if resp, err := http.DefaultClient.Do(r); err == nil {
			resp.Body.Close()
			t.Fatal("the client was meant to give up")
		}
		time.Sleep(100 * time.Millisecond) // the server sees the client go
		held.Release()
		srv.Close() // waits for the request to end
		if inServer.Load() != 1 || h.calls.Load() != 0 || effects(t)+records(t) != 0 {
			t.Fatalf("%d requests, %d runs, %d effects, %d records", inServer.Load(), h.calls.Load(), effects(t), records(t))
		}
	})
}

// TestTimeLimit: past WithTimeLimit the key's transaction is rolled back
// and the key freed while the handler still hangs; the hung request is
// answered 503 time-limit
func TestTimeLimit(t *testing.T) {
	c := newClient(t, testPool, WithTimeLimit(400*time.Millisecond))
	for name, hang := range map[string]func(r *http.Request) error{
		"a handler that hangs in Go, idle in the transaction": func(r *http.Request) error {
			time.Sleep(1500 * time.Millisecond)
			return nil
		},
		"a handler that hangs in SQL": func(r *http.Request) error {
			_, err := Tx(r.Context()).Exec(context.Background(), "SELECT pg_sleep(3)")
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			reset(t)
			var calls atomic.Int32
			mw := c.Middleware()(HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				ctx := r.Context()
				if _, err := Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('slow')"); err != nil {
					return err
				}
				if calls.Add(1) == 1 {
					if err := hang(r); err != nil {
						return err
					}
				}
				w.WriteHeader(201)
				return nil
			}))
			hung := make(chan *httptest.ResponseRecorder, 1)
			start := time.Now()
			go func() { hung <- post("k", `{}`).do(mw) }()
			// the key is free again well before the hung handler returns
			time.Sleep(900 * time.Millisecond)
			if w := post("k", `{}`).do(mw); w.Code != 201 {
				t.Fatalf("the retry while the first hangs: %d %s", w.Code, w.Body)
			}
			w := <-hung
			if w.Code != 503 || w.Header().Get("Retry-After") != "1" || problemCode(t, w) != CodeTimeLimit {
				t.Fatalf("the hung request: %d %v %s after %v", w.Code, w.Header(), w.Body, time.Since(start))
			}
			if n := effects(t); n != 1 || calls.Load() != 2 {
				t.Fatalf("%d effects, %d runs; want 1 and 2", n, calls.Load())
			}
		})
	}
	t.Run("a handler within the limit commits", func(t *testing.T) {
		reset(t)
		if w := post("k", `{}`).do(c.Middleware()(&effectHandler{sleep: 100 * time.Millisecond})); w.Code != 201 || effects(t) != 1 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	})
}
