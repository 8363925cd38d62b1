package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Option configures a [Client] (the defaults of every route) or one
// [Client.Middleware] (that route only).
type Option func(*config)

// config is the settings of a client or of one route
type config struct {
	operation     string
	scope         func(*http.Request) (string, bool)
	subset        []string
	ttl           time.Duration
	keyOptional   bool
	replayHeaders map[string]bool
	retryable     func(int) bool
	final         func(error) bool
	errorHandler  func(http.ResponseWriter, *http.Request, error) bool
	mapping       Mapping
	retryAfter    int
	methods       map[string]bool
	logger        *slog.Logger
	txOptions     pgx.TxOptions
	acquire       time.Duration
	timeLimit     time.Duration
	bodyLimit     int64
	responseLimit int
	errs          []error
}

// defaultConfig is doc/clients.md's "Settings every library has"
func defaultConfig() config {
	return config{
		replayHeaders: map[string]bool{"content-type": true, "location": true},
		retryable:     DefaultRetryable,
		mapping:       DefaultMapping(),
		retryAfter:    1,
		methods:       map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		acquire:       DefaultAcquireTimeout,
		bodyLimit:     DefaultBodyLimit,
		responseLimit: DefaultResponseLimit,
	}
}

// with returns a copy of c with opts applied; maps are copied first
func (c config) with(opts []Option) config {
	c.replayHeaders = cloneSet(c.replayHeaders)
	c.methods = cloneSet(c.methods)
	c.mapping = c.mapping.clone()
	c.subset = append([]string(nil), c.subset...)
	c.errs = append([]error(nil), c.errs...)
	for _, o := range opts {
		o(&c)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c
}

func cloneSet(m map[string]bool) map[string]bool {
	n := make(map[string]bool, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}

// DefaultRetryable reports whether a handler status rolls back instead of
// completing by default: every 5xx, 408 and 429.
func DefaultRetryable(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
}

// WithOperation names the operation of the route, such as "create-payment".
// By default it is "METHOD path-template" ("POST /payments/{id}"), from the
// pattern net/http's ServeMux or chi matched (http.Request.Pattern), or the
// request's path where the middleware runs before routing.
func WithOperation(name string) Option {
	return func(c *config) {
		if name == "" || len(name) > 63 {
			c.errs = append(c.errs, fmt.Errorf("idempotency: the operation must be 1 to 63 bytes, not %q", name))
		}
		c.operation = name
	}
}

// WithScope sets the function that returns the authenticated principal of a
// request (a user, an account, an API client): the scope that keeps one
// principal's keys from another's. It must never come from a header the
// client chooses freely. ok false answers 401 unauthenticated. A middleware
// without a scope function is refused when it is created.
func WithScope(scope func(r *http.Request) (principal string, ok bool)) Option {
	return func(c *config) { c.scope = scope }
}

// WithFingerprint names the members of a JSON body that make two requests
// the same, as RFC 6901 JSON Pointers ("/order_id", "/amount"); by default
// the whole body is. A route with a subset answers 400 invalid-request to a
// body that is not JSON.
func WithFingerprint(pointers ...string) Option {
	return func(c *config) {
		for _, p := range pointers {
			if err := ValidatePointer(p); err != nil {
				c.errs = append(c.errs, err)
			}
		}
		c.subset = append([]string(nil), pointers...)
	}
}

// WithTTL sets how long a completed record replays, counted from its
// completion; 0, the default, is the server's idempotency.default_ttl.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) {
		if ttl < 0 || (ttl > 0 && ttl < time.Microsecond) {
			c.errs = append(c.errs, fmt.Errorf("idempotency: the ttl must be positive and at least a microsecond (PostgreSQL's resolution), not %v", ttl))
		}
		c.ttl = ttl
	}
}

// WithKeyOptional makes the Idempotency-Key optional: a request without one
// runs the handler without idempotency (and without a transaction: [Tx]
// returns nil). By default a missing key is 400 missing-key.
func WithKeyOptional() Option {
	return func(c *config) { c.keyOptional = true }
}

// WithReplayHeaders adds header names to the allow-list of headers stored
// with a response and replayed (by default Content-Type and Location).
func WithReplayHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.replayHeaders[strings.ToLower(n)] = true
		}
	}
}

// WithRetryable sets which handler statuses roll back instead of completing
// (by default [DefaultRetryable]: 5xx, 408, 429). A status it refuses is a
// final answer: completed and replayed like a success.
func WithRetryable(retryable func(status int) bool) Option {
	return func(c *config) {
		if retryable == nil {
			c.errs = append(c.errs, errors.New("idempotency: WithRetryable needs a function"))
			return
		}
		c.retryable = retryable
	}
}

// WithFinalErrors sets which raised errors are final answers: an error a
// [HandlerFunc] returns (or a [Client.BeginFunc] function returns with a
// response) for which final reports true is completed with the response
// it resolves to ([WithErrorHandler], or the mapping) and committed, as if
// the handler had returned that response, and its retry replays it. By
// default no error is final: a raised error rolls back whatever status it
// resolves to, and the retry runs again. A panic is never final.
//
//	idempotency.WithFinalErrors(func(err error) bool { return errors.Is(err, ErrCardDeclined) })
func WithFinalErrors(final func(err error) bool) Option {
	return func(c *config) {
		if final == nil {
			c.errs = append(c.errs, errors.New("idempotency: WithFinalErrors needs a function"))
			return
		}
		c.final = final
	}
}

// WithErrorHandler sets how an error a [HandlerFunc] returns is answered:
// handle writes the answer to w (a status, headers and a body, as a handler
// does) and reports true, or reports false, writing nothing, to leave the
// error to the mapping (a *pgconn.PgError by its SQLSTATE, anything else
// 500 internal-error, logged). The error is rolled back either way, unless
// [WithFinalErrors] marks it final.
func WithErrorHandler(handle func(w http.ResponseWriter, r *http.Request, err error) bool) Option {
	return func(c *config) {
		if handle == nil {
			c.errs = append(c.errs, errors.New("idempotency: WithErrorHandler needs a function"))
			return
		}
		c.errorHandler = handle
	}
}

// WithMapping replaces the whole mapping of outcomes and errors to answers
// (see [DefaultMapping]).
func WithMapping(m Mapping) Option {
	return func(c *config) { c.mapping = m.clone() }
}

// WithProblem changes one row of the mapping, by problem code: its status,
// title, detail and whether it has Retry-After.
func WithProblem(code string, p Problem) Option {
	return func(c *config) {
		if p.Status < 100 || p.Status > 599 {
			c.errs = append(c.errs, fmt.Errorf("idempotency: problem %q: status %d is not an HTTP status", code, p.Status))
		}
		c.mapping.Problems[code] = p
	}
}

// WithRetryAfter sets the seconds of Retry-After for the cases of the
// mapping that have it (1 by default; 0 sends none).
func WithRetryAfter(seconds int) Option {
	return func(c *config) {
		if seconds < 0 {
			c.errs = append(c.errs, fmt.Errorf("idempotency: Retry-After must not be negative, not %d", seconds))
		}
		c.retryAfter = seconds
	}
}

// WithMethods sets the HTTP methods the middleware makes idempotent (by
// default POST and PATCH); requests with other methods go to the handler
// untouched.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		c.methods = map[string]bool{}
		for _, m := range methods {
			c.methods[strings.ToUpper(m)] = true
		}
	}
}

// WithLogger sets where internal errors are logged (by
// default slog.Default()); the client is told only "internal-error".
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// DefaultAcquireTimeout is how long a request waits for a connection from
// the pool by default.
const DefaultAcquireTimeout = 5 * time.Second

// WithAcquireTimeout sets how long a request waits for a connection from the
// pool, and to begin its transaction ([DefaultAcquireTimeout]; 0: no limit
// but the context's). Past it the request is 503 unavailable with
// Retry-After ([ErrUnavailable]), and nothing is reserved.
func WithAcquireTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, fmt.Errorf("idempotency: the acquire timeout must not be negative, not %v", d))
		}
		c.acquire = d
	}
}

// WithTimeLimit bounds the key's transaction, the handler included (0, the
// default: no limit). The server ends a statement that runs, or the
// session idle in the transaction, past it (statement_timeout and
// idle_in_transaction_session_timeout, set for the transaction only), which
// frees the key; the handler's context has the deadline; and a handler
// that returns past it is rolled back and answered 503 time-limit with
// Retry-After ([ErrTimeLimit]). Keep it below the server's
// idempotency.processing_timeout, so that a hung handler never holds a key
// long enough to make it stuck.
func WithTimeLimit(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, fmt.Errorf("idempotency: the time limit must not be negative, not %v", d))
		}
		c.timeLimit = d
	}
}

// DefaultBodyLimit and DefaultResponseLimit are the default limits of a
// request body read by the middleware and of a stored response body: 1 MiB.
const (
	DefaultBodyLimit     = 1 << 20
	DefaultResponseLimit = 1 << 20
)

// WithBodyLimit sets the most bytes of a request body the middleware reads
// ([DefaultBodyLimit]; 0: no limit). A longer body is 413
// payload-too-large before anything is reserved, by its Content-Length
// or once the limit is read.
func WithBodyLimit(bytes int64) Option {
	return func(c *config) {
		if bytes < 0 {
			c.errs = append(c.errs, fmt.Errorf("idempotency: the body limit must not be negative, not %d", bytes))
		}
		c.bodyLimit = bytes
	}
}

// WithResponseLimit sets the most bytes of a response body that is stored
// ([DefaultResponseLimit]; 0: no limit). A longer body that would be
// completed is a *[CompletionError] instead: rolled back, 500
// internal-error, and the retry runs again.
func WithResponseLimit(bytes int) Option {
	return func(c *config) {
		if bytes < 0 {
			c.errs = append(c.errs, fmt.Errorf("idempotency: the response limit must not be negative, not %d", bytes))
		}
		c.responseLimit = bytes
	}
}

// WithTxOptions sets the options of the transaction (isolation level, ...).
func WithTxOptions(o pgx.TxOptions) Option {
	return func(c *config) { c.txOptions = o }
}
