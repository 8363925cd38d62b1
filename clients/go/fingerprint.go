package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrSubsetNotJSON is returned by [RequestDocument] when a fingerprint
// subset is given and the body is not JSON.
var ErrSubsetNotJSON = errors.New("idempotency: the request body is not JSON, and the route fingerprints members of it")

// IsJSONMediaType reports whether a Content-Type is application/json or a
// structured syntax suffix +json (application/problem+json), whatever its
// parameters.
func IsJSONMediaType(contentType string) bool {
	if contentType == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.Contains(mt, "/") && strings.HasSuffix(mt, "+json"))
}

// MaxBodyDepth is the deepest nesting of arrays and objects a body may have
// and still be JSON to the library, the same in every language
// (doc/clients.md, "The fingerprint"): a body nested deeper is bytes
// (body_base64).
const MaxBodyDepth = 256

// isJSON reports whether a body of this content type is stored and
// fingerprinted as JSON: the type says so, the bytes parse, and they are
// nested at most MaxBodyDepth levels deep
func isJSON(contentType string, body []byte) bool {
	return len(body) > 0 && IsJSONMediaType(contentType) && utf8.Valid(body) && json.Valid(body) &&
		!nestedDeeper(body, MaxBodyDepth)
}

// nestedDeeper reports whether valid JSON text has arrays and objects nested
// more than limit levels deep
func nestedDeeper(text []byte, limit int) bool {
	depth := 0
	inString, escaped := false, false
	for _, c := range text {
		switch {
		case inString:
			if escaped {
				escaped = false
			} else if c == '\\' {
				escaped = true
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > limit {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// requestDocument is the document idem_reserve fingerprints
type requestDocument struct {
	Method     string          `json:"method"`
	Path       string          `json:"path"`
	Body       json.RawMessage `json:"body,omitempty"`
	BodyBase64 *string         `json:"body_base64,omitempty"`
}

// RequestDocument returns the request document whose fingerprint
// idem_reserve stores (doc/clients.md, "The fingerprint"):
//
//	{"method": "POST", "path": "/payments", "body": {"order_id": "o-1", "amount": 100}}
//
// method is upper-cased; path is the request's path without the query
// string. A body whose contentType is JSON and that parses is "body"; any
// other non-empty body is "body_base64", its bytes in padded base64; an
// empty body is neither. With subset (RFC 6901 JSON Pointers, validated with
// [ValidatePointer]), "body" is an object from each pointer to the value it
// finds, null where it finds none; a subset on a body that is not JSON is
// [ErrSubsetNotJSON].
func RequestDocument(method, path, contentType string, body []byte, subset []string) ([]byte, error) {
	doc := requestDocument{Method: strings.ToUpper(method), Path: path}
	switch {
	case len(subset) > 0:
		if !isJSON(contentType, body) {
			return nil, ErrSubsetNotJSON
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, ErrSubsetNotJSON
		}
		members := make(map[string]json.RawMessage, len(subset))
		for _, p := range subset {
			found, ok, err := lookupPointer(v, p)
			if err != nil {
				return nil, err
			}
			if !ok {
				members[p] = json.RawMessage("null")
				continue
			}
			raw, err := json.Marshal(found)
			if err != nil {
				return nil, err
			}
			members[p] = raw
		}
		raw, err := json.Marshal(members)
		if err != nil {
			return nil, err
		}
		doc.Body = raw
	case isJSON(contentType, body):
		doc.Body = body
	case len(body) > 0:
		s := base64.StdEncoding.EncodeToString(body)
		doc.BodyBase64 = &s
	}
	return json.Marshal(doc)
}

// ValidatePointer checks that p is an RFC 6901 JSON Pointer: empty (the
// whole document) or "/" followed by tokens whose only escapes are ~0 and ~1.
func ValidatePointer(p string) error {
	if p == "" {
		return nil
	}
	if p[0] != '/' {
		return fmt.Errorf("idempotency: JSON Pointer %q does not begin with \"/\"", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 == len(p) || (p[i+1] != '0' && p[i+1] != '1')) {
			return fmt.Errorf("idempotency: JSON Pointer %q has a \"~\" not followed by 0 or 1", p)
		}
	}
	return nil
}

// lookupPointer evaluates the JSON Pointer p on v (decoded with UseNumber)
func lookupPointer(v any, p string) (any, bool, error) {
	if err := ValidatePointer(p); err != nil {
		return nil, false, err
	}
	if p == "" {
		return v, true, nil
	}
	for _, tok := range strings.Split(p[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch cur := v.(type) {
		case map[string]any:
			next, ok := cur[tok]
			if !ok {
				return nil, false, nil
			}
			v = next
		case []any:
			if tok == "" || (len(tok) > 1 && tok[0] == '0') || strings.TrimLeft(tok, "0123456789") != "" {
				return nil, false, nil
			}
			i, err := strconv.Atoi(tok)
			if err != nil || i >= len(cur) {
				return nil, false, nil
			}
			v = cur[i]
		default:
			return nil, false, nil
		}
	}
	return v, true, nil
}
