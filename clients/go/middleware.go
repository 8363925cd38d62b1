package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

type txKey struct{}

// Tx returns the transaction the middleware runs the handler in, from the
// request's context: the handler's SQL on it commits with the key's record
// or not at all. It returns nil outside the middleware, and for a request
// without a key on a route with [WithKeyOptional].
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// HandlerFunc is an HTTP handler that can fail: given to [Client.Middleware]
// directly, a non-nil error is the raised error of doc/clients.md. It rolls
// the transaction back, whatever the handler wrote, and is answered by
// [WithErrorHandler], or else from the mapping (a *pgconn.PgError by its
// SQLSTATE: 40001 is 503 retry, ...; anything else 500 internal-error,
// logged). An error [WithFinalErrors] marks final is completed with that
// answer instead.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// ServeHTTP calls f; outside the middleware an error is answered from the
// default mapping.
func (f HandlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := f(w, r); err != nil {
		cfg := defaultConfig().with(nil)
		send(w, cfg.errorResponse(err, r))
	}
}

// Middleware returns the net/http (and chi) middleware that makes the
// handler idempotent, with the client's settings overridden by opts.
//
// For a POST or PATCH ([WithMethods]) it parses the Idempotency-Key header
// ([ParseKey]), takes the scope from the [WithScope] function, reads the
// body and builds the request document ([RequestDocument]); then, in one
// transaction, it reserves the key and, on "new", runs the handler with the
// request's context carrying the transaction ([Tx]) and a ResponseWriter
// that buffers the status, headers and body. A response with a status that
// is not retryable is completed and committed, and only then sent; a
// retryable status or a [HandlerFunc]'s error (unless final) rolls back. A
// panic rolls back and goes on, unrecovered, to net/http (which closes the
// connection) or the application's recoverer, which answers it. A response
// that cannot be written as it is or stored ([CompletionError]) rolls back
// and is answered 500 internal-error. A replay
// answers the stored status, allow-listed headers and body with
// Idempotent-Replayed: true; other outcomes and errors are answered from the
// mapping as application/problem+json.
//
// The handler and the completion run on context.WithoutCancel of the
// request's context: a client that disconnects never rolls back a request
// about to commit, so its retry replays. The wait for a connection
// ([WithAcquireTimeout]) and the reservation end when the client goes away,
// and a handler whose client has left is not started.
//
// Use it per route, where the router knows the route's pattern (chi's
// r.With(mw), or wrapping the handler given to http.ServeMux.Handle), so
// that the default operation is "METHOD path-template". Middleware panics,
// as http.ServeMux.Handle does for a bad pattern, when no scope function is
// configured or an option is invalid.
func (c *Client) Middleware(opts ...Option) func(http.Handler) http.Handler {
	cfg := c.cfg.with(opts)
	if len(cfg.errs) > 0 {
		panic(cfg.errs[0])
	}
	if cfg.scope == nil {
		panic("idempotency: the middleware needs a scope function (WithScope): the principal a key belongs to")
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !cfg.methods[r.Method] {
				next.ServeHTTP(w, r)
				return
			}
			send(w, c.serve(&cfg, next, w, r))
		})
	}
}

// serve runs one idempotent request and returns the answer to send
func (c *Client) serve(cfg *config, next http.Handler, w http.ResponseWriter, r *http.Request) Response {
	values := r.Header.Values("Idempotency-Key")
	if len(values) == 0 {
		if cfg.keyOptional {
			// runs on the real writer: the answer is written by next
			next.ServeHTTP(w, r)
			return Response{}
		}
		return cfg.problemResponse(CodeMissingKey, "")
	}
	key, err := ParseKey(values)
	if err != nil {
		return cfg.problemResponse(CodeInvalidKey, err.(*KeyError).Detail)
	}
	scope, ok := cfg.scope(r)
	if !ok || scope == "" {
		return cfg.problemResponse(CodeUnauthenticated, "")
	}
	var body []byte
	if r.Body != nil {
		if cfg.bodyLimit > 0 && r.ContentLength > cfg.bodyLimit {
			return cfg.problemResponse(CodePayloadTooLarge, "")
		}
		reader := io.Reader(r.Body)
		if cfg.bodyLimit > 0 {
			reader = io.LimitReader(r.Body, cfg.bodyLimit+1)
		}
		body, err = io.ReadAll(reader)
		r.Body.Close()
		if err == nil && cfg.bodyLimit > 0 && int64(len(body)) > cfg.bodyLimit {
			return cfg.problemResponse(CodePayloadTooLarge, "")
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				return cfg.problemResponse(CodePayloadTooLarge, "")
			}
			return cfg.problemResponse(CodeInvalidRequest, "The request body could not be read.")
		}
	}
	doc, err := RequestDocument(r.Method, requestPath(r), r.Header.Get("Content-Type"), body, cfg.subset)
	if errors.Is(err, ErrSubsetNotJSON) {
		return cfg.problemResponse(CodeInvalidRequest, "The request body must be JSON: this route fingerprints members of it.")
	} else if err != nil {
		return cfg.errorResponse(err, r)
	}

	req := Request{Operation: cfg.operationOf(r), Scope: scope, Key: key, Document: doc}
	var resolved Response // the answer to the error a HandlerFunc returned
	// the wait for a connection and the reservation end when the client
	// goes away; the handler, once started, runs on
	res, err := c.run(r.Context(), cfg, req, func(ctx context.Context, tx pgx.Tx) (Response, error) {
		if ctx.Err() != nil {
			// the client left while the request waited: not started
			resolved = cfg.problemResponse(CodeUnavailable, "")
			return resolved, errClientGone
		}
		deadline, limited := ctx.Deadline()
		ctx = context.WithoutCancel(ctx)
		if limited && cfg.timeLimit > 0 {
			// the time limit's deadline, not the client's cancellation
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		hr := r.WithContext(context.WithValue(ctx, txKey{}, tx))
		hr.Body = io.NopCloser(bytes.NewReader(body))
		hr.ContentLength = int64(len(body))
		hr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		cw := &captureWriter{header: http.Header{}}
		// a panic is not recovered: it rolls back (run's deferred
		// ROLLBACK) and goes on to net/http or the application's recoverer
		f, ok := next.(HandlerFunc)
		if !ok {
			next.ServeHTTP(cw, hr)
			return cw.response(), nil
		}
		raised := f(cw, hr)
		if raised == nil {
			return cw.response(), nil
		}
		if tx.Conn().IsClosed() {
			raised = fmt.Errorf("%w: %w", ErrUnavailable, raised)
		}
		resolved = cfg.resolve(raised, hr)
		return resolved, raised
	}, checkSendable)
	if res.raised && (err != nil || res.Committed) {
		// completed when final, rolled back otherwise: answered as
		// resolved, if it can be sent as it is
		if err := checkSendable(resolved); err != nil {
			return cfg.errorResponse(err, r)
		}
		return resolved
	}
	if err != nil {
		return cfg.errorResponse(err, r)
	}
	if res.Outcome == OutcomeReplay {
		res.Response.Header.Set("Idempotent-Replayed", "true")
	}
	return res.Response
}

// errClientGone: the client left before its handler started
var errClientGone = errors.New("idempotency: the client went away before the handler started")

// resolve is the answer to an error a HandlerFunc returned: the error
// handler's, or the mapping's
func (cfg *config) resolve(err error, r *http.Request) Response {
	if cfg.errorHandler != nil {
		ew := &captureWriter{header: http.Header{}}
		if cfg.errorHandler(ew, r, err) {
			return ew.response()
		}
	}
	return cfg.errorResponse(err, r)
}

// operationOf is the route's operation: the configured one, or METHOD and
// the pattern the router matched, or METHOD and the path
func (cfg *config) operationOf(r *http.Request) string {
	if cfg.operation != "" {
		return cfg.operation
	}
	path := r.Pattern
	if i := strings.IndexAny(path, " \t"); i >= 0 {
		// ServeMux: "[METHOD ][HOST]/PATH"
		path = strings.TrimLeft(path[i:], " \t")
	}
	if i := strings.IndexByte(path, '/'); i > 0 {
		path = path[i:]
	}
	if path == "" {
		path = r.URL.Path
	}
	op := r.Method + " " + path
	if len(op) > 63 {
		op = op[:63]
	}
	return op
}

// requestPath is the path as the client sent it, without the query string
func requestPath(r *http.Request) string {
	if u := r.RequestURI; strings.HasPrefix(u, "/") {
		if i := strings.IndexByte(u, '?'); i >= 0 {
			u = u[:i]
		}
		return u
	}
	return r.URL.EscapedPath()
}

// errorResponse maps an error to its problem: the outcomes' errors, a
// SQLSTATE of the mapping (22023 with the extension's message), or
// internal-error, logged
func (cfg *config) errorResponse(err error, r *http.Request) Response {
	switch {
	case errors.Is(err, ErrInProgress):
		return cfg.problemResponse(CodeInProgress, "")
	case errors.Is(err, ErrMismatch):
		return cfg.problemResponse(CodeMismatch, "")
	case errors.Is(err, ErrStuck):
		return cfg.problemResponse(CodeStuck, "")
	case errors.Is(err, ErrUnsupportedEnvelope):
		return cfg.problemResponse(CodeUnsupportedEnvelope, "")
	case errors.Is(err, ErrTimeLimit):
		cfg.logger.Warn("idempotency: the request ran past its time limit; rolled back", "method", r.Method, "path", r.URL.Path)
		return cfg.problemResponse(CodeTimeLimit, "")
	}
	var unsendable *CompletionError
	if errors.As(err, &unsendable) {
		// rolled back: never mapped by the SQLSTATE of the server's error
		cfg.logger.Error("idempotency: the response cannot be sent or stored; rolled back", "method", r.Method, "path", r.URL.Path, "error", err)
		return cfg.problemResponse(CodeInternalError, "")
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if code, ok := cfg.mapping.SQLStates[pgErr.Code]; ok {
			detail := ""
			if code == CodeInvalidRequest {
				detail = pgErr.Message
			}
			return cfg.problemResponse(code, detail)
		}
	}
	if connectionLost(err) {
		cfg.logger.Warn("idempotency: the database cannot be reached; rolled back", "method", r.Method, "path", r.URL.Path, "error", err)
		return cfg.problemResponse(CodeUnavailable, "")
	}
	cfg.logger.Error("idempotency: request failed and was rolled back", "method", r.Method, "path", r.URL.Path, "error", err)
	return cfg.problemResponse(CodeInternalError, "")
}

// connectionLost reports whether err is the database going away without a
// SQLSTATE: a connection the pool cannot make, or one closed under the
// transaction (ErrUnavailable)
func connectionLost(err error) bool {
	var connect *pgconn.ConnectError
	return errors.As(err, &connect) || errors.Is(err, ErrUnavailable)
}

// send writes a buffered answer to the client; a zero Response was written
// already
func send(w http.ResponseWriter, resp Response) {
	if resp.Status == 0 {
		return
	}
	h := w.Header()
	for name, values := range resp.Header {
		h[name] = values
	}
	if bodyAllowed(resp.Status) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	} else {
		h.Del("Content-Length")
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body)
	}
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// captureWriter buffers the handler's response until the transaction has
// committed. It has no Flush, Hijack or Unwrap: nothing can reach the client
// before COMMIT.
type captureWriter struct {
	header http.Header
	sent   http.Header // the header as of WriteHeader
	status int
	body   bytes.Buffer
}

func (c *captureWriter) Header() http.Header { return c.header }

func (c *captureWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if c.status != 0 || (code >= 100 && code < 200) {
		return // a second call, or an informational status: not the answer
	}
	c.status = code
	c.sent = c.header.Clone()
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	return c.body.Write(p)
}

// response is what the handler answered, with the Content-Type net/http
// would have sniffed
func (c *captureWriter) response() Response {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	h := c.sent
	body := c.body.Bytes()
	if _, ok := h["Content-Type"]; !ok && len(body) > 0 {
		h.Set("Content-Type", http.DetectContentType(body))
	}
	h.Del("Content-Length")
	return Response{Status: c.status, Header: h, Body: body}
}
