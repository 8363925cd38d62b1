package idempotency

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// CompletionError is the error for a response that cannot be sent or
// stored (doc/clients.md, "Only what can be sent is committed"): a header
// name that is not an RFC 9110 token, a header value with a character
// other than visible ASCII, space and tab, a status outside 200 to 599 (the
// middleware's part), or a body the server cannot store (idem_complete's
// SQLSTATE 22P05, 22P02, ...). Nothing is completed: the transaction is
// rolled back, the middleware answers 500 internal-error, and the retry
// runs again.
type CompletionError struct {
	// Reason says what is wrong, for the log.
	Reason string
	// Err is the server's error, for a body it cannot store.
	Err error
}

func (e *CompletionError) Error() string {
	if e.Err != nil {
		return "idempotency: the response cannot be completed: " + e.Reason + ": " + e.Err.Error()
	}
	return "idempotency: the response cannot be completed: " + e.Reason
}

func (e *CompletionError) Unwrap() error { return e.Err }

// storeError is idem_complete's error: a data exception (class 22) or
// 54001 is the response's, a *CompletionError
func storeError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code[:2] == "22" || pgErr.Code == "54001") {
		return &CompletionError{Reason: "the server cannot store its body", Err: err}
	}
	return err
}

// checkHeaders checks that every header can be written as it is: the name
// an RFC 9110 token, each value visible ASCII (0x21 to 0x7E) with spaces
// and tabs (no CR, LF, NUL or other control character, nothing above 0x7E)
func checkHeaders(h http.Header) error {
	for name, values := range h {
		if !validHeaderName(name) {
			return &CompletionError{Reason: fmt.Sprintf("header name %q is not an RFC 9110 token", name)}
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return badHeaderValue(name, v)
			}
		}
	}
	return nil
}

func badHeaderValue(name, value string) error {
	return &CompletionError{Reason: fmt.Sprintf("header %s has a character other than visible ASCII, space and tab: %q", name, value)}
}

// checkSendable is the middleware's check of the whole response it is
// about to write: its headers and its status
func checkSendable(resp Response) error {
	if resp.Status < 200 || resp.Status > 599 {
		return &CompletionError{Reason: fmt.Sprintf("status %d is not 200 to 599", resp.Status)}
	}
	return checkHeaders(resp.Header)
}

// validHeaderName reports whether s is an RFC 9110 token
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether s is visible ASCII, spaces and tabs
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x21 || c > 0x7e) && c != ' ' && c != '\t' {
			return false
		}
	}
	return true
}
