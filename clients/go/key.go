package idempotency

import (
	"strings"
)

// KeyError is the error [ParseKey] returns for a malformed Idempotency-Key
// header. Detail is a sentence for the client, used as the problem's detail.
type KeyError struct {
	Detail string
}

func (e *KeyError) Error() string {
	return "idempotency: invalid Idempotency-Key: " + e.Detail
}

// ParseKey parses the values of the Idempotency-Key header fields of a
// request (http.Header.Values("Idempotency-Key")) and returns the key.
//
// The value is an RFC 8941 sf-string, "...", of printable ASCII (0x20 to
// 0x7E) whose only escapes are \" and \\, as
// draft-ietf-httpapi-idempotency-key-header defines it; the bare form (the
// value without quotes, trimmed of spaces and tabs) is accepted too, so that
// "abc" and abc are one key. It returns a *KeyError for more than one field, a
// list (a bare value with a comma), a quoted value that is not closed, has a
// bad escape, a character outside 0x20 to 0x7E or anything but spaces and
// tabs after its closing quote (parameters included), and an empty key. The
// characters of a bare key are left to the extension, which refuses what is
// not printable ASCII (SQLSTATE 22023). The caller checks for a missing
// header (no values) first.
func ParseKey(values []string) (string, error) {
	if len(values) == 0 {
		return "", &KeyError{Detail: "The request has no Idempotency-Key header."}
	}
	if len(values) > 1 {
		return "", &KeyError{Detail: "The request has more than one Idempotency-Key header field."}
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", &KeyError{Detail: "The Idempotency-Key is empty."}
	}
	if v[0] != '"' {
		return parseBareKey(v)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", &KeyError{Detail: `The Idempotency-Key has an escape other than \" or \\.`}
			}
			b.WriteByte(v[i])
		case c == '"':
			if strings.Trim(v[i+1:], " \t") != "" {
				return "", &KeyError{Detail: "The Idempotency-Key has something after its closing quote: it must be one string, without parameters."}
			}
			if b.Len() == 0 {
				return "", &KeyError{Detail: "The Idempotency-Key is empty."}
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", &KeyError{Detail: "The Idempotency-Key has a character outside printable ASCII (0x20 to 0x7E)."}
		default:
			b.WriteByte(c)
		}
	}
	return "", &KeyError{Detail: "The Idempotency-Key has no closing quote."}
}

// parseBareKey checks a key given without quotes: one value, not a list.
// Its characters are the extension's to check (22023, invalid-request, with
// the extension's message), as doc/clients.md says
func parseBareKey(v string) (string, error) {
	if strings.ContainsRune(v, ',') {
		return "", &KeyError{Detail: "The Idempotency-Key holds a list: it must be one key."}
	}
	return v, nil
}
