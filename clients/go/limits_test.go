package idempotency

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBodyLimit: a request body over the limit is 413 payload-too-large
// before anything is reserved, by its Content-Length or as it is read
func TestBodyLimit(t *testing.T) {
	c := newClient(t, testPool)
	body := func(n int) string { return `"` + strings.Repeat("x", n-2) + `"` }
	for _, tt := range []struct {
		name    string
		mw      func(http.Handler) http.Handler
		size    int
		chunked bool
		status  int
	}{
		{"at the limit", c.Middleware(WithBodyLimit(100)), 100, false, 201},
		{"one byte over, by Content-Length", c.Middleware(WithBodyLimit(100)), 101, false, 413},
		{"one byte over, chunked", c.Middleware(WithBodyLimit(100)), 101, true, 413},
		{"at the default 1 MiB", c.Middleware(), DefaultBodyLimit, true, 201},
		{"over the default 1 MiB", c.Middleware(), DefaultBodyLimit + 1, true, 413},
		{"no limit", c.Middleware(WithBodyLimit(0)), DefaultBodyLimit + 1, true, 201},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reset(t)
			h := &effectHandler{}
			r := httptest.NewRequest("POST", "/payments", strings.NewReader(body(tt.size)))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", "k")
			r.Header.Set("Authorization", "Bearer acct-a")
			if tt.chunked {
				r.ContentLength = -1
			}
			w := httptest.NewRecorder()
			tt.mw(h).ServeHTTP(w, r)
			if w.Code != tt.status {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			if tt.status == 413 && (problemCode(t, w) != CodePayloadTooLarge || h.calls.Load() != 0 || records(t) != 0) {
				t.Fatalf("%s, %d runs, %d records", w.Body, h.calls.Load(), records(t))
			}
		})
	}
}

// TestResponseLimit: a response body over the stored-response limit is
// rolled back and answered 500 internal-error, and the retry runs again
func TestResponseLimit(t *testing.T) {
	c := newClient(t, testPool, WithResponseLimit(10))
	answer := func(status int, body string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			if _, err := Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('big')"); err != nil {
				panic(err)
			}
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		})
	}
	reset(t)
	for i := 0; i < 2; i++ {
		w := post("k", `{}`).do(c.Middleware()(answer(200, "eleven byte")))
		if w.Code != 500 || problemCode(t, w) != CodeInternalError || effects(t)+records(t) != 0 {
			t.Fatalf("attempt %d: %d %s, %d effects", i, w.Code, w.Body, effects(t))
		}
	}
	// a retryable answer is not stored: it goes out as it is
	if w := post("k", `{}`).do(c.Middleware()(answer(503, "eleven byte"))); w.Code != 503 || w.Body.String() != "eleven byte" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if w := post("k", `{}`).do(c.Middleware()(answer(200, "ten bytes!"))); w.Code != 200 || effects(t) != 1 || records(t) != 1 {
		t.Fatalf("at the limit: %d %s", w.Code, w.Body)
	}
}
