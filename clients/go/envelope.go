package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// EnvelopeVersion is the version of the response envelope this package
// writes and the highest it reads.
const EnvelopeVersion = 1

// ErrUnsupportedEnvelope is returned for a stored response whose envelope
// version is not one this package reads (a higher "v").
var ErrUnsupportedEnvelope = errors.New("idempotency: the stored response has an envelope version this library does not read")

// Response is an HTTP response as the library stores and replays it.
type Response struct {
	// Status is the HTTP status code, 100 to 599.
	Status int
	// Header holds the response's headers. When stored, only those on the
	// replay allow-list are kept.
	Header http.Header
	// Body is the response body.
	Body []byte
}

type envelope struct {
	V          json.RawMessage   `json:"v"`
	Headers    map[string]string `json:"headers"`
	Body       json.RawMessage   `json:"body,omitempty"`
	BodyBase64 *string           `json:"body_base64,omitempty"`
}

// EncodeEnvelope returns the response envelope idem_complete stores
// (doc/clients.md, "The response envelope"):
//
//	{"v": 1, "headers": {"content-type": "application/json"}, "body": {"id": 42}}
//
// headers holds the response headers whose lower-cased names are in allow
// (lower-cased names), several values joined with ", "; body is the body as
// JSON when its Content-Type is JSON and it parses, otherwise body_base64;
// neither for an empty body. A stored header value with a character other
// than visible ASCII, space and tab is a *[CompletionError].
func EncodeEnvelope(resp Response, allow map[string]bool) ([]byte, error) {
	env := envelope{V: json.RawMessage("1"), Headers: map[string]string{}}
	for name, values := range resp.Header {
		lower := strings.ToLower(name)
		if allow[lower] && len(values) > 0 {
			for _, v := range values {
				if !validHeaderValue(v) {
					return nil, badHeaderValue(name, v)
				}
			}
			if prev, ok := env.Headers[lower]; ok {
				values = append([]string{prev}, values...)
			}
			env.Headers[lower] = strings.Join(values, ", ")
		}
	}
	switch {
	case isJSON(resp.Header.Get("Content-Type"), resp.Body):
		env.Body = resp.Body
	case len(resp.Body) > 0:
		s := base64.StdEncoding.EncodeToString(resp.Body)
		env.BodyBase64 = &s
	}
	return json.Marshal(env)
}

// DecodeEnvelope turns a stored response (idem_keys.response, as JSON text;
// nil for SQL NULL) and its status back into a Response. A response without
// "v", as plain SQL completes it, is a JSON body with Content-Type
// application/json; a "v" other than 1 is [ErrUnsupportedEnvelope].
func DecodeEnvelope(status int, stored []byte) (Response, error) {
	resp := Response{Status: status, Header: http.Header{}}
	if stored == nil {
		return resp, nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(stored, &members); err != nil || members["v"] == nil {
		// not an object, or an object without "v": a plain JSON body
		resp.Header.Set("Content-Type", "application/json")
		resp.Body = bytes.TrimSpace(stored)
		return resp, nil
	}
	var env envelope
	if err := json.Unmarshal(stored, &env); err != nil {
		return resp, fmt.Errorf("idempotency: malformed response envelope: %w", err)
	}
	if string(env.V) != "1" {
		return resp, ErrUnsupportedEnvelope
	}
	names := make([]string, 0, len(env.Headers))
	for name := range env.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		resp.Header.Set(name, env.Headers[name])
	}
	switch {
	case env.Body != nil:
		resp.Body = env.Body
	case env.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*env.BodyBase64)
		if err != nil {
			return resp, fmt.Errorf("idempotency: malformed response envelope: body_base64: %w", err)
		}
		resp.Body = b
	}
	return resp, nil
}
