package idempotency

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// storeThenSet completes key k through the middleware mw, then overwrites
// its stored response with SQL, as any role with UPDATE on idem_keys (or a
// service with a wider allow-list) can
func storeThenSet(t *testing.T, mw http.Handler, response string) {
	t.Helper()
	if w := post("k", `{}`).do(mw); w.Code != 201 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if _, err := testPool.Exec(context.Background(), "UPDATE idem_keys SET response = $1::jsonb WHERE key = 'k'", response); err != nil {
		t.Fatal(err)
	}
}

// TestUnreadableEnvelope: a record the library cannot read is 500
// unsupported-envelope, never a partial or garbled answer, and the handler
// does not run (doc/clients.md, "The response envelope")
func TestUnreadableEnvelope(t *testing.T) {
	c := newClient(t, testPool)
	for name, response := range map[string]string{
		`"v": "1"`:                        `{"v": "1", "headers": {}}`,
		`"v": 2`:                          `{"v": 2, "headers": {}}`,
		`"v": null`:                       `{"v": null, "headers": {}}`,
		`"v": true`:                       `{"v": true, "headers": {}}`,
		`"headers": []`:                   `{"v": 1, "headers": []}`,
		`"headers": null`:                 `{"v": 1, "headers": null}`,
		`a number as a header value`:      `{"v": 1, "headers": {"location": 1}}`,
		`null as a header value`:          `{"v": 1, "headers": {"location": null}}`,
		`CR LF in a header value`:         `{"v": 1, "headers": {"location": "/a\r\nset-cookie: x=1"}}`,
		`€ in a header value`:             `{"v": 1, "headers": {"content-type": "text/plain; charset=€"}}`,
		`CR LF off the allow-list`:        `{"v": 1, "headers": {"x-other": "a\r\nb"}}`,
		`a header name with a space`:      `{"v": 1, "headers": {"bad name": "1"}}`,
		`body and body_base64`:            `{"v": 1, "headers": {}, "body": {"a": 1}, "body_base64": "YQ=="}`,
		`body_base64 without padding`:     `{"v": 1, "headers": {}, "body_base64": "YQ"}`,
		`body_base64 with stray bits`:     `{"v": 1, "headers": {}, "body_base64": "YR=="}`,
		`body_base64 with a newline`:      `{"v": 1, "headers": {}, "body_base64": "YWJj\nZA=="}`,
		`body_base64 of another alphabet`: `{"v": 1, "headers": {}, "body_base64": "-_8="}`,
		`body_base64 a number`:            `{"v": 1, "headers": {}, "body_base64": 12}`,
	} {
		t.Run(name, func(t *testing.T) {
			reset(t)
			h := &effectHandler{}
			mw := c.Middleware()(h)
			storeThenSet(t, mw, response)
			w := post("k", `{}`).do(mw)
			if w.Code != 500 || problemCode(t, w) != CodeUnsupportedEnvelope || w.Header().Get("Idempotent-Replayed") != "" ||
				w.Header().Get("Location") != "" || w.Header().Get("Set-Cookie") != "" {
				t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body)
			}
			if h.calls.Load() != 1 || effects(t) != 1 {
				t.Fatalf("%d runs, %d effects", h.calls.Load(), effects(t))
			}
		})
	}
	t.Run(`"v": 1.0 is 1`, func(t *testing.T) {
		reset(t)
		mw := c.Middleware()(&effectHandler{})
		storeThenSet(t, mw, `{"v": 1.0, "headers": {"content-type": "text/plain"}, "body_base64": "YWJj"}`)
		w := post("k", `{}`).do(mw)
		if w.Code != 201 || w.Body.String() != "abc" || w.Header().Get("Content-Type") != "text/plain" {
			t.Fatalf("%d %v %q", w.Code, w.Header(), w.Body)
		}
	})
}

// TestReplayAllowList: the allow-list applies when replaying; framing and
// hop-by-hop headers are never replayed, even when allow-listed; Set-Cookie
// only when allow-listed
func TestReplayAllowList(t *testing.T) {
	c := newClient(t, testPool)
	stored := `{"v": 1, "headers": {"content-type": "application/json", "location": "/effects/1",
		"set-cookie": "session=stolen", "content-length": "3", "transfer-encoding": "chunked",
		"connection": "close", "keep-alive": "timeout=5", "te": "trailers", "trailer": "x-t",
		"upgrade": "h2c", "proxy-connection": "close", "x-wider": "1"},
		"body": {"replayed": "a body longer than three bytes"}}`
	framing := []string{"Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade", "Proxy-Connection"}
	t.Run("the route's list, now", func(t *testing.T) {
		reset(t)
		mw := c.Middleware()(&effectHandler{})
		storeThenSet(t, mw, stored)
		w := post("k", `{}`).do(mw)
		if w.Code != 201 || w.Header().Get("Location") != "/effects/1" || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("%d %v", w.Code, w.Header())
		}
		for _, name := range append([]string{"Set-Cookie", "X-Wider"}, framing[1:]...) {
			if v := w.Header().Get(name); v != "" {
				t.Fatalf("%s replayed: %q", name, v)
			}
		}
		if !jsonEqual(t, w.Body.Bytes(), []byte(`{"replayed": "a body longer than three bytes"}`)) ||
			w.Header().Get("Content-Length") != itoa(int64(w.Body.Len())) {
			t.Fatalf("%v %s", w.Header(), w.Body)
		}
	})
	t.Run("allow-listed framing headers are never replayed; Set-Cookie is", func(t *testing.T) {
		reset(t)
		mw := c.Middleware(WithReplayHeaders(append([]string{"Set-Cookie", "X-Wider"}, framing...)...))(&effectHandler{})
		storeThenSet(t, mw, stored)
		srv := httptest.NewServer(mw)
		defer srv.Close()
		resp, text := serverPost(t, srv.URL)
		body := []byte(text)
		if resp.StatusCode != 201 || resp.Header.Get("Set-Cookie") != "session=stolen" || resp.Header.Get("X-Wider") != "1" {
			t.Fatalf("%d %v", resp.StatusCode, resp.Header)
		}
		// the server framed the body itself: all of it, not 3 bytes, not chunked
		if !jsonEqual(t, body, []byte(`{"replayed": "a body longer than three bytes"}`)) || resp.ContentLength != int64(len(body)) ||
			len(resp.TransferEncoding) != 0 || resp.Close {
			t.Fatalf("%q, length %d, %v, close %v", body, resp.ContentLength, resp.TransferEncoding, resp.Close)
		}
		for _, name := range framing[4:] {
			if v := resp.Header.Get(name); v != "" {
				t.Fatalf("%s replayed: %q", name, v)
			}
		}
	})
	t.Run("framing headers are not stored either", func(t *testing.T) {
		reset(t)
		mw := c.Middleware(WithReplayHeaders(framing...))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "2")
			w.Header().Set("Connection", "close")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, "ok")
		}))
		if w := post("k", `{}`).do(mw); w.Code != 200 {
			t.Fatal(w.Code)
		}
		if n := count(t, `SELECT count(*) FROM idem_keys WHERE response->'headers' ?| array['content-length', 'connection']`); n != 0 {
			t.Fatal("a framing header was stored")
		}
	})
}
