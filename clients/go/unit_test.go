package idempotency

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string // "" means a *KeyError
	}{
		{"quoted", []string{`"8e03978e-40d5"`}, "8e03978e-40d5"},
		{"bare", []string{`8e03978e-40d5`}, "8e03978e-40d5"},
		{"bare trimmed of spaces and tabs", []string{" \tabc\t "}, "abc"},
		{"quoted with spaces around", []string{`  "abc"  `}, "abc"},
		{"quoted with spaces inside", []string{`" a b "`}, " a b "},
		{"escaped quote", []string{`"a\"b"`}, `a"b`},
		{"escaped backslash", []string{`"a\\b"`}, `a\b`},
		{"comma inside quotes", []string{`"a,b"`}, "a,b"},
		{"two fields", []string{`"a"`, `"b"`}, ""},
		{"two identical fields", []string{`"a"`, `"a"`}, ""},
		{"quoted list", []string{`"a", "b"`}, ""},
		{"bare list", []string{`a, b`}, ""},
		{"bare comma", []string{`a,b`}, ""},
		{"not closed", []string{`"abc`}, ""},
		{"escape at the end", []string{`"abc\`}, ""},
		{"bad escape", []string{`"a\nb"`}, ""},
		{"bad escape of a letter", []string{`"a\qb"`}, ""},
		{"tab inside quotes", []string{"\"a\tb\""}, ""},
		{"non-ASCII inside quotes", []string{"\"caf\xc3\xa9\""}, ""},
		{"non-ASCII bare: the extension's to refuse", []string{"caf\xc3\xa9"}, "caf\xc3\xa9"},
		{"bare with a quote inside", []string{`ab"c`}, `ab"c`},
		{"parameter", []string{`"a";p=1`}, ""},
		{"garbage after the quote", []string{`"a"b`}, ""},
		{"empty quoted", []string{`""`}, ""},
		{"empty", []string{""}, ""},
		{"only spaces", []string{"   "}, ""},
		{"no field", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKey(tt.values)
			if tt.want == "" {
				var ke *KeyError
				if !errors.As(err, &ke) || ke.Detail == "" {
					t.Fatalf("ParseKey(%q) = %q, %v; want a *KeyError", tt.values, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", tt.values, got, err, tt.want)
			}
		})
	}
}

func TestRequestDocument(t *testing.T) {
	tests := []struct {
		name        string
		method      string
		contentType string
		body        string
		subset      []string
		want        string // JSON; "" means ErrSubsetNotJSON
	}{
		{"json body", "post", "application/json", `{"order_id": "o-1", "amount": 100}`, nil,
			`{"method": "POST", "path": "/p", "body": {"order_id": "o-1", "amount": 100}}`},
		{"json with charset", "POST", "application/json; charset=utf-8", `[1,2]`, nil,
			`{"method": "POST", "path": "/p", "body": [1, 2]}`},
		{"+json suffix", "POST", "application/merge-patch+json", `{"a": null}`, nil,
			`{"method": "POST", "path": "/p", "body": {"a": null}}`},
		{"json that does not parse", "POST", "application/json", `{"a":`, nil,
			`{"method": "POST", "path": "/p", "body_base64": "eyJhIjo="}`},
		{"json body with another type", "POST", "text/plain", `{"a": 1}`, nil,
			`{"method": "POST", "path": "/p", "body_base64": "eyJhIjogMX0="}`},
		{"no content type", "POST", "", "abc", nil,
			`{"method": "POST", "path": "/p", "body_base64": "YWJj"}`},
		{"empty body", "PATCH", "application/json", "", nil,
			`{"method": "PATCH", "path": "/p"}`},
		{"subset", "POST", "application/json", `{"order_id": "o-1", "amount": 100, "note": "x"}`, []string{"/order_id", "/amount"},
			`{"method": "POST", "path": "/p", "body": {"/amount": 100, "/order_id": "o-1"}}`},
		{"subset: missing member is null", "POST", "application/json", `{"a": 1}`, []string{"/a", "/b", "/a/x"},
			`{"method": "POST", "path": "/p", "body": {"/a": 1, "/b": null, "/a/x": null}}`},
		{"subset: escapes and arrays", "POST", "application/json", `{"a/b": {"m~n": [10, 20]}, "l": [1]}`, []string{"/a~1b/m~0n/1", "/l/01", "/l/-", "/l/0"},
			`{"method": "POST", "path": "/p", "body": {"/a~1b/m~0n/1": 20, "/l/01": null, "/l/-": null, "/l/0": 1}}`},
		{"subset: whole document", "POST", "application/json", `{"a": 1.50}`, []string{""},
			`{"method": "POST", "path": "/p", "body": {"": {"a": 1.50}}}`},
		{"subset on a non-JSON body", "POST", "text/plain", `abc`, []string{"/a"}, ""},
		{"subset on an empty body", "POST", "application/json", ``, []string{"/a"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RequestDocument(tt.method, "/p", tt.contentType, []byte(tt.body), tt.subset)
			if tt.want == "" {
				if !errors.Is(err, ErrSubsetNotJSON) {
					t.Fatalf("got %s, %v; want ErrSubsetNotJSON", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !jsonEqual(t, got, []byte(tt.want)) {
				t.Fatalf("got %s; want %s", got, tt.want)
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

func TestValidatePointer(t *testing.T) {
	for p, ok := range map[string]bool{"": true, "/": true, "/a/~0~1": true, "a": false, "/a~": false, "/a~2": false} {
		if err := ValidatePointer(p); (err == nil) != ok {
			t.Errorf("ValidatePointer(%q) = %v", p, err)
		}
	}
}

// deep256 is JSON nested 256 levels deep (MaxBodyDepth), with a string
// whose brackets and escaped quote do not count
var deep256 = strings.Repeat(`[`, 255) + `{"s": "[{\"\\"}` + strings.Repeat(`]`, 255)

func TestEnvelope(t *testing.T) {
	allow := map[string]bool{"content-type": true, "location": true}
	tests := []struct {
		name string
		resp Response
		want string
	}{
		{"json", Response{201, http.Header{"Content-Type": {"application/json"}, "Location": {"/p/1"}, "X-Other": {"x"}}, []byte(`{"id": 1}`)},
			`{"v": 1, "headers": {"content-type": "application/json", "location": "/p/1"}, "body": {"id": 1}}`},
		{"problem json", Response{402, http.Header{"Content-Type": {"application/problem+json"}}, []byte(`{"code": "x"}`)},
			`{"v": 1, "headers": {"content-type": "application/problem+json"}, "body": {"code": "x"}}`},
		{"text", Response{200, http.Header{"Content-Type": {"text/plain"}}, []byte("hi\n")},
			`{"v": 1, "headers": {"content-type": "text/plain"}, "body_base64": "aGkK"}`},
		{"json type that does not parse", Response{200, http.Header{"Content-Type": {"application/json"}}, []byte("{")},
			`{"v": 1, "headers": {"content-type": "application/json"}, "body_base64": "ew=="}`},
		{"json nested 256 levels", Response{200, http.Header{"Content-Type": {"application/json"}}, []byte(deep256)},
			`{"v": 1, "headers": {"content-type": "application/json"}, "body": ` + deep256 + `}`},
		{"json nested 257 levels", Response{200, http.Header{"Content-Type": {"application/json"}}, []byte("[" + deep256 + "]")},
			`{"v": 1, "headers": {"content-type": "application/json"}, "body_base64": "` + base64.StdEncoding.EncodeToString([]byte("["+deep256+"]")) + `"}`},
		{"empty", Response{204, http.Header{}, nil}, `{"v": 1, "headers": {}}`},
		{"several values", Response{200, http.Header{"Location": {"a", "b"}}, nil}, `{"v": 1, "headers": {"location": "a, b"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EncodeEnvelope(tt.resp, allow)
			if err != nil {
				t.Fatal(err)
			}
			if !jsonEqual(t, got, []byte(tt.want)) {
				t.Fatalf("EncodeEnvelope = %s; want %s", got, tt.want)
			}
			back, err := DecodeEnvelope(tt.resp.Status, got, allow)
			if err != nil {
				t.Fatal(err)
			}
			same := string(back.Body) == string(tt.resp.Body)
			if isJSON(tt.resp.Header.Get("Content-Type"), tt.resp.Body) {
				same = jsonEqual(t, back.Body, tt.resp.Body)
			}
			if !same || back.Status != tt.resp.Status {
				t.Fatalf("round trip: %d %q; want %d %q", back.Status, back.Body, tt.resp.Status, tt.resp.Body)
			}
			for name := range allow {
				if back.Header.Get(name) != "" && back.Header.Get(name) != joined(tt.resp.Header.Values(name)) {
					t.Fatalf("round trip: header %s = %q", name, back.Header.Get(name))
				}
			}
		})
	}
	if _, err := DecodeEnvelope(200, []byte(`{"v": 2, "headers": {}}`), allow); !errors.Is(err, ErrUnsupportedEnvelope) {
		t.Fatalf("v 2: %v", err)
	}
	plain, err := DecodeEnvelope(200, []byte(`{"id": 1}`), allow)
	if err != nil || plain.Header.Get("Content-Type") != "application/json" || string(plain.Body) != `{"id": 1}` {
		t.Fatalf("no v: %+v %v", plain, err)
	}
}

func joined(v []string) string {
	s := ""
	for i, x := range v {
		if i > 0 {
			s += ", "
		}
		s += x
	}
	return s
}

func TestCaptureWriter(t *testing.T) {
	c := &captureWriter{header: http.Header{}}
	c.Header().Set("X-Before", "1")
	c.WriteHeader(http.StatusEarlyHints) // informational: not the answer
	c.WriteHeader(http.StatusCreated)
	c.Header().Set("X-After", "1") // too late, as with net/http
	c.WriteHeader(http.StatusOK)   // ignored
	_, _ = c.Write([]byte("<html>hi</html>"))
	r := c.response()
	if r.Status != 201 || r.Header.Get("X-Before") != "1" || r.Header.Get("X-After") != "" ||
		r.Header.Get("Content-Type") != "text/html; charset=utf-8" || string(r.Body) != "<html>hi</html>" {
		t.Fatalf("%+v", r)
	}
	nc := &captureWriter{header: http.Header{}}
	nc.WriteHeader(http.StatusNoContent)
	if _, err := nc.Write([]byte("x")); !errors.Is(err, http.ErrBodyNotAllowed) {
		t.Fatalf("204 with a body: %v", err)
	}
	if _, ok := any(c).(http.Flusher); ok {
		t.Fatal("the capture writer must not flush before COMMIT")
	}
}

func TestCompareVersions(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{{"0.2.0", "0.2.0", 0}, {"0.1.0", "0.2.0", -1}, {"0.10.0", "0.2.0", 1}, {"1.0", "0.2.0", 1}, {"0.2", "0.2.0", 0}} {
		if got := compareVersions(tt.a, tt.b); got != tt.want {
			t.Errorf("compareVersions(%q, %q) = %d", tt.a, tt.b, got)
		}
	}
}
