package idempotency

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/jackc/pgx/v5"
)

// errDeclined is the tests' raised error that resolves to 402
var errDeclined = errors.New("card declined")

// declinedBody is the answer errDeclined resolves to
const declinedBody = `{"code": "card-declined", "detail": "The card was declined."}`

// answerDeclined is an error handler (WithErrorHandler) and the core of a
// recoverer: errDeclined is 402 with declinedBody
func answerDeclined(w http.ResponseWriter, r *http.Request, err error) bool {
	if !errors.Is(err, errDeclined) {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusPaymentRequired)
	_, _ = io.WriteString(w, declinedBody)
	return true
}

func isDeclined(err error) bool { return errors.Is(err, errDeclined) }

// raising INSERTs one effect and then raises errDeclined: returned from a
// HandlerFunc, or as a panic
type raising struct {
	calls     atomic.Int32
	panics    bool
	breakTx   bool // the handler's own SQL fails after the INSERT
	raiseWith error
}

func (h *raising) serve(w http.ResponseWriter, r *http.Request) error {
	h.calls.Add(1)
	ctx := r.Context()
	if _, err := Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('raised')"); err != nil {
		return err
	}
	if h.breakTx {
		if _, err := Tx(ctx).Exec(ctx, "SELECT 1/0"); err == nil {
			panic("1/0 did not fail")
		}
	}
	w.WriteHeader(201) // overruled by the error
	err := h.raiseWith
	if err == nil {
		err = errDeclined
	}
	if h.panics {
		panic(err)
	}
	return err
}

// recoverDeclined is the application's recoverer: a panic with errDeclined
// is 402 with declinedBody, any other panic goes on
func recoverDeclined(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if err, ok := v.(error); !ok || !answerDeclined(w, r, err) {
					panic(v)
				}
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func records(t *testing.T) int { return count(t, "SELECT count(*) FROM idem_keys") }

// TestRaisedErrorRollsBack: a raised error is rolled back whatever status it
// resolves to, and the client gets that status and body; the retry runs
// again (doc/clients.md, "The request, step by step", 5)
func TestRaisedErrorRollsBack(t *testing.T) {
	c := newClient(t, testPool)
	for name, build := range map[string]func(h *raising) http.Handler{
		"a HandlerFunc's error, answered by WithErrorHandler": func(h *raising) http.Handler {
			return c.Middleware(WithErrorHandler(answerDeclined))(HandlerFunc(h.serve))
		},
		"a panic, answered by the application's recoverer": func(h *raising) http.Handler {
			h.panics = true
			// final errors do not apply to panics
			return recoverDeclined(c.Middleware(WithFinalErrors(isDeclined))(HandlerFunc(h.serve)))
		},
		"a panic in a plain http.Handler, chi routing": func(h *raising) http.Handler {
			h.panics = true
			r := chi.NewRouter()
			r.Use(recoverDeclined)
			r.With(c.Middleware()).Post("/payments", func(w http.ResponseWriter, r *http.Request) { _ = h.serve(w, r) })
			return r
		},
		"a final error whose transaction failed": func(h *raising) http.Handler {
			h.breakTx = true
			return c.Middleware(WithErrorHandler(answerDeclined), WithFinalErrors(isDeclined))(HandlerFunc(h.serve))
		},
	} {
		t.Run(name, func(t *testing.T) {
			reset(t)
			h := &raising{}
			mw := build(h)
			for i := 1; i <= 2; i++ {
				w := post("k", `{"amount": 2000000}`).do(mw)
				if w.Code != 402 || w.Body.String() != declinedBody || w.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("attempt %d: %d %v %s", i, w.Code, w.Header(), w.Body)
				}
				if n := effects(t) + records(t); n != 0 {
					t.Fatalf("attempt %d: %d effects and records, want 0", i, n)
				}
				if n := h.calls.Load(); n != int32(i) {
					t.Fatalf("attempt %d: the handler ran %d times", i, n)
				}
			}
		})
	}
	t.Run("a panic through chi's Recoverer is its 500", func(t *testing.T) {
		reset(t)
		h := &raising{panics: true}
		r := chi.NewRouter()
		r.Use(middleware.Recoverer)
		r.With(c.Middleware()).Method("POST", "/payments", HandlerFunc(h.serve))
		w := post("k", `{}`).do(r)
		if w.Code != 500 || effects(t)+records(t) != 0 {
			t.Fatalf("%d %s, %d effects, %d records", w.Code, w.Body, effects(t), records(t))
		}
	})
	t.Run("a panic without a recoverer, through a real server", func(t *testing.T) {
		reset(t)
		h := &raising{panics: true}
		srv := httptest.NewUnstartedServer(c.Middleware()(HandlerFunc(h.serve)))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.Start()
		defer srv.Close()
		for i := 0; i < 2; i++ {
			r, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{}`))
			r.Header.Set("Idempotency-Key", "k")
			r.Header.Set("Authorization", "Bearer acct-a")
			if resp, err := http.DefaultClient.Do(r); err == nil {
				resp.Body.Close()
				t.Fatalf("net/http answered a panic: %d", resp.StatusCode)
			}
		}
		if effects(t)+records(t) != 0 || h.calls.Load() != 2 {
			t.Fatalf("%d effects, %d records, %d runs", effects(t), records(t), h.calls.Load())
		}
	})
	t.Run("a final error that resolves to a retryable status", func(t *testing.T) {
		reset(t)
		h := &raising{raiseWith: errors.New("secret internals")}
		mw := c.Middleware(WithFinalErrors(func(error) bool { return true }))(HandlerFunc(h.serve))
		w := post("k", `{}`).do(mw)
		if w.Code != 500 || problemCode(t, w) != CodeInternalError || strings.Contains(w.Body.String(), "secret") {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		if effects(t)+records(t) != 0 {
			t.Fatal("a 500 was completed")
		}
	})
}

// TestFinalError: an error marked final is completed with the answer it
// resolves to, and its retry replays it
func TestFinalError(t *testing.T) {
	reset(t)
	h := &raising{}
	mw := newClient(t, testPool, WithFinalErrors(isDeclined)).Middleware(WithErrorHandler(answerDeclined))(HandlerFunc(h.serve))
	first := post("k", `{"amount": 2000000}`).do(mw)
	if first.Code != 402 || first.Body.String() != declinedBody || effects(t) != 1 ||
		count(t, "SELECT count(*) FROM idem_keys WHERE status = 'completed' AND response_status = 402") != 1 {
		t.Fatalf("%d %s, %d effects", first.Code, first.Body, effects(t))
	}
	second := post("k", `{"amount": 2000000}`).do(mw)
	if second.Code != 402 || second.Header().Get("Idempotent-Replayed") != "true" || !jsonEqual(t, second.Body.Bytes(), first.Body.Bytes()) ||
		second.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("the retry: %d %v %s", second.Code, second.Header(), second.Body)
	}
	if h.calls.Load() != 1 || effects(t) != 1 {
		t.Fatalf("%d runs, %d effects", h.calls.Load(), effects(t))
	}
	// another error of the same handler is not final: rolled back
	other := &raising{raiseWith: errors.New("another")}
	w := post("k2", `{}`).do(newClient(t, testPool, WithFinalErrors(isDeclined)).Middleware()(HandlerFunc(other.serve)))
	if w.Code != 500 || effects(t) != 1 || records(t) != 1 {
		t.Fatalf("%d, %d effects, %d records", w.Code, effects(t), records(t))
	}

	// BeginFunc: the error is returned with the response it completes
	ctx := context.Background()
	c := newClient(t, testPool, WithFinalErrors(isDeclined))
	r := Request{Operation: "charge", Scope: "acct-a", Key: "b", Document: []byte(`{"amount": 5}`)}
	fn := func(ctx context.Context, tx pgx.Tx) (Response, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO effects (note) VALUES ('b')"); err != nil {
			return Response{}, err
		}
		return Response{Status: 402, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"declined": true}`)}, errDeclined
	}
	res, err := c.BeginFunc(ctx, r, fn)
	if !errors.Is(err, errDeclined) || !res.Committed || res.Outcome != OutcomeNew || effects(t) != 2 {
		t.Fatalf("%+v %v, %d effects", res, err, effects(t))
	}
	res, err = c.BeginFunc(ctx, r, fn)
	if err != nil || res.Outcome != OutcomeReplay || res.Response.Status != 402 || string(res.Response.Body) != `{"declined": true}` || effects(t) != 2 {
		t.Fatalf("%+v %v", res, err)
	}
}

// TestEmptyPrincipal: a scope function that answers an empty principal is
// 401, as one that finds none (never a scope shared by everyone)
func TestEmptyPrincipal(t *testing.T) {
	reset(t)
	h := &effectHandler{}
	c := newClient(t, testPool, WithScope(func(*http.Request) (string, bool) { return "", true }))
	w := post("k", `{}`).do(c.Middleware()(h))
	if w.Code != 401 || problemCode(t, w) != CodeUnauthenticated || h.calls.Load() != 0 || records(t) != 0 {
		t.Fatalf("%d %s, %d runs", w.Code, w.Body, h.calls.Load())
	}
}

// TestBadPrincipal: a principal the extension refuses is 400
// invalid-request in every language, nothing reserved, the handler not run
func TestBadPrincipal(t *testing.T) {
	for name, principal := range map[string]string{
		"a NUL":                   "acct\x00a",
		"over 255 bytes":          strings.Repeat("a", 256),
		"the reserved idem: form": "idem:acct-a",
	} {
		t.Run(name, func(t *testing.T) {
			reset(t)
			h := &effectHandler{}
			c := newClient(t, testPool, WithScope(func(*http.Request) (string, bool) { return principal, true }))
			w := post("k", `{}`).do(c.Middleware()(h))
			if w.Code != 400 || problemCode(t, w) != CodeInvalidRequest || h.calls.Load() != 0 || records(t) != 0 {
				t.Fatalf("%d %s, %d runs", w.Code, w.Body, h.calls.Load())
			}
		})
	}
}
