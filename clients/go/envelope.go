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

// ErrUnsupportedEnvelope is returned (wrapped, with what is wrong) for a
// stored response this package cannot read: a higher envelope version
// ("v"), or an envelope with members of the wrong types or bad base64.
var ErrUnsupportedEnvelope = errors.New("idempotency: the stored response is not an envelope this library reads")

// neverReplayed are the framing and hop-by-hop headers: never stored or
// replayed, even when allow-listed (the server frames the body itself)
var neverReplayed = map[string]bool{
	"content-length": true, "transfer-encoding": true, "connection": true, "keep-alive": true,
	"te": true, "trailer": true, "upgrade": true, "proxy-connection": true,
}

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
// (lower-cased names), but for the framing and hop-by-hop ones
// (Content-Length, Transfer-Encoding, Connection, ...), several values
// joined with ", "; body is the body as
// JSON when its Content-Type is JSON and it parses, otherwise body_base64;
// neither for an empty body. A stored header value with a character other
// than visible ASCII, space and tab is a *[CompletionError].
func EncodeEnvelope(resp Response, allow map[string]bool) ([]byte, error) {
	env := envelope{V: json.RawMessage("1"), Headers: map[string]string{}}
	for name, values := range resp.Header {
		lower := strings.ToLower(name)
		if allow[lower] && !neverReplayed[lower] && len(values) > 0 {
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
// nil for SQL NULL) and its status back into a Response, with the stored
// headers whose names are in allow (lower-cased names) now: the allow-list
// applies when replaying as well as when storing, and the framing and
// hop-by-hop headers ([neverReplayed]) are never replayed. A response
// without "v", as plain SQL completes it, is a JSON body with Content-Type
// application/json. A record this package cannot read is
// [ErrUnsupportedEnvelope] (doc/clients.md, "The response envelope"): "v"
// that is not a number equal to 1, "headers" that is not an object of
// strings, a header name that is not a token or a value with a character
// other than visible ASCII, space and tab, both "body" and "body_base64", or
// "body_base64" that is not padded RFC 4648 base64.
func DecodeEnvelope(status int, stored []byte, allow map[string]bool) (Response, error) {
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
	unreadable := func(what string) (Response, error) {
		return Response{}, fmt.Errorf("%w: %s", ErrUnsupportedEnvelope, what)
	}
	var v float64
	if err := json.Unmarshal(members["v"], &v); err != nil || v != EnvelopeVersion {
		return unreadable(`"v" is not the number 1: ` + string(members["v"]))
	}
	var raw map[string]any
	if h, ok := members["headers"]; ok {
		if err := json.Unmarshal(h, &raw); err != nil || raw == nil {
			return unreadable(`"headers" is not an object`)
		}
	}
	headers := make(map[string]string, len(raw))
	for name, value := range raw {
		s, ok := value.(string)
		if !ok {
			return unreadable(fmt.Sprintf("header %q is not a string", name))
		}
		headers[name] = s
	}
	names := make([]string, 0, len(headers))
	for name, value := range headers {
		if !validHeaderName(name) || !validHeaderValue(value) {
			return unreadable(fmt.Sprintf("header %q: %q cannot be sent", name, value))
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if lower := strings.ToLower(name); allow[lower] && !neverReplayed[lower] {
			resp.Header.Add(name, headers[name])
		}
	}
	body, hasBody := members["body"]
	encoded, hasBase64 := members["body_base64"]
	switch {
	case hasBody && hasBase64:
		return unreadable(`both "body" and "body_base64"`)
	case hasBody:
		resp.Body = body
	case hasBase64:
		var text any
		_ = json.Unmarshal(encoded, &text)
		s, ok := text.(string)
		if !ok || strings.ContainsAny(s, "\r\n") {
			return unreadable(`"body_base64" is not a string of padded base64`)
		}
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		if err != nil {
			return unreadable(`"body_base64" is not padded base64`)
		}
		resp.Body = b
	}
	return resp, nil
}
