package idempotency

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// unsendable INSERTs one effect and answers what edit makes of a 201
type unsendable struct {
	calls atomic.Int32
	edit  func(w http.ResponseWriter) (status int, body string)
}

func (h *unsendable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	ctx := r.Context()
	if _, err := Tx(ctx).Exec(ctx, "INSERT INTO effects (note) VALUES ('unsendable')"); err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	status, body := h.edit(w)
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// the responses no server here can write as they are, or PostgreSQL
// cannot store (doc/clients.md, "Only what can be sent is committed")
var unsendables = map[string]func(w http.ResponseWriter) (int, string){
	"CR LF in Location (client text)": func(w http.ResponseWriter) (int, string) {
		w.Header().Set("Location", "/payments/1\r\nSet-Cookie: session=stolen")
		return 201, `{}`
	},
	"a lone LF in Location": func(w http.ResponseWriter) (int, string) {
		w.Header().Set("Location", "/payments/1\nX: y")
		return 201, `{}`
	},
	"€ in Content-Type": func(w http.ResponseWriter) (int, string) {
		w.Header().Set("Content-Type", "text/plain; charset=€")
		return 201, `x`
	},
	"Latin-1 é in a header off the allow-list": func(w http.ResponseWriter) (int, string) {
		w.Header().Set("X-Name", "Jos\xe9")
		return 201, `{}`
	},
	"NUL in a header off the allow-list": func(w http.ResponseWriter) (int, string) {
		w.Header().Set("X-Tag", "a\x00b")
		return 201, `{}`
	},
	"DEL in a header": func(w http.ResponseWriter) (int, string) {
		w.Header().Set("X-Tag", "a\x7fb")
		return 201, `{}`
	},
	"a header name with a space": func(w http.ResponseWriter) (int, string) {
		w.Header()["X Bad"] = []string{"1"}
		return 201, `{}`
	},
	"a header name with a colon": func(w http.ResponseWriter) (int, string) {
		w.Header()["X-Bad:"] = []string{"1"}
		return 201, `{}`
	},
	"an empty header name": func(w http.ResponseWriter) (int, string) {
		w.Header()[""] = []string{"1"}
		return 201, `{}`
	},
	"status 600": func(w http.ResponseWriter) (int, string) { return 600, `{}` },
	"a retryable status with CR LF": func(w http.ResponseWriter) (int, string) {
		w.Header().Set("Location", "/x\r\nX: y")
		return 503, `{}`
	},
	`\u0000 in a JSON body`:           func(w http.ResponseWriter) (int, string) { return 201, `{"name": "a\u0000b"}` },
	`\u0000 as a member name`:         func(w http.ResponseWriter) (int, string) { return 201, `{"\u0000": 1}` },
	"a lone surrogate in a JSON body": func(w http.ResponseWriter) (int, string) { return 201, `{"name": "\ud800"}` },
}

// TestOnlyWhatCanBeSentIsCommitted: through net/http's test recorder, each
// response that cannot be sent or stored is rolled back and answered 500
// internal-error, and the retry runs the handler again
func TestOnlyWhatCanBeSentIsCommitted(t *testing.T) {
	c := newClient(t, testPool)
	for name, edit := range unsendables {
		t.Run(name, func(t *testing.T) {
			reset(t)
			h := &unsendable{edit: edit}
			mw := c.Middleware()(h)
			for i := 1; i <= 2; i++ {
				w := post("k", `{}`).do(mw)
				if w.Code != 500 || problemCode(t, w) != CodeInternalError {
					t.Fatalf("attempt %d: %d %v %s", i, w.Code, w.Header(), w.Body)
				}
				if len(w.Header()) != 2 { // Content-Type and Content-Length
					t.Fatalf("attempt %d: the handler's headers went out: %v", i, w.Header())
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
}

// serverPost sends the usual request (key k, account acct-a, {}) to a real
// server and reads the whole answer
func serverPost(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	r, _ := http.NewRequest("POST", url+"/payments", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	r.Header.Set("Authorization", "Bearer acct-a")
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// TestOnlyWhatCanBeSentThroughAServer: through a real net/http server,
// which rewrites CR and LF to spaces and drops invalid names when it
// writes: the middleware refuses first (500, rolled back); a value that
// can be sent is written and replayed as it is
func TestOnlyWhatCanBeSentThroughAServer(t *testing.T) {
	c := newClient(t, testPool)
	do := func(url string) (*http.Response, string) { return serverPost(t, url) }
	for _, name := range []string{"CR LF in Location (client text)", "€ in Content-Type", "a header name with a space", `\u0000 in a JSON body`} {
		t.Run(name, func(t *testing.T) {
			reset(t)
			h := &unsendable{edit: unsendables[name]}
			srv := httptest.NewServer(c.Middleware()(h))
			defer srv.Close()
			for i := 1; i <= 2; i++ {
				resp, body := do(srv.URL)
				if resp.StatusCode != 500 || !strings.Contains(body, `"internal-error"`) ||
					resp.Header.Get("Location") != "" || resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("X-Bad") != "" {
					t.Fatalf("attempt %d: %d %v %s", i, resp.StatusCode, resp.Header, body)
				}
			}
			if n := effects(t) + records(t); n != 0 || h.calls.Load() != 2 {
				t.Fatalf("%d effects and records, %d runs", n, h.calls.Load())
			}
		})
	}
	t.Run("spaces and tabs inside a value are sent and replayed as they are", func(t *testing.T) {
		reset(t)
		h := &unsendable{edit: func(w http.ResponseWriter) (int, string) {
			w.Header().Set("Location", "/payments/a b\tc")
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			return 201, `{"ok": true}`
		}}
		srv := httptest.NewServer(c.Middleware()(h))
		defer srv.Close()
		first, _ := do(srv.URL)
		second, body := do(srv.URL)
		for _, resp := range []*http.Response{first, second} {
			if resp.StatusCode != 201 || resp.Header.Get("Location") != "/payments/a b\tc" || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
				t.Fatalf("%d %v", resp.StatusCode, resp.Header)
			}
		}
		if second.Header.Get("Idempotent-Replayed") != "true" || !jsonEqual(t, []byte(body), []byte(`{"ok": true}`)) || h.calls.Load() != 1 || effects(t) != 1 {
			t.Fatalf("the replay: %v %s, %d runs", second.Header, body, h.calls.Load())
		}
	})
}

// TestUnsendableErrorAnswer: the answer an error handler writes for a
// raised error that rolls back is checked too: 500 internal-error, never
// rewritten by net/http
func TestUnsendableErrorAnswer(t *testing.T) {
	reset(t)
	h := &raising{}
	mw := newClient(t, testPool).Middleware(WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) bool {
		w.Header().Set("Location", "/declined\r\nSet-Cookie: a=b")
		w.WriteHeader(402)
		return true
	}))(HandlerFunc(h.serve))
	w := post("k", `{}`).do(mw)
	if w.Code != 500 || problemCode(t, w) != CodeInternalError || w.Header().Get("Location") != "" || effects(t)+records(t) != 0 {
		t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
	}
}
