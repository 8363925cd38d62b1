package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Version is this package's version.
const Version = "0.1.0"

// MinExtensionVersion is the oldest extension version the package works
// with: the first with idem_reserve's scope and ttl arguments.
const MinExtensionVersion = "0.2.0"

// DB is what the client needs of a database handle: *pgxpool.Pool (the usual
// one) and *pgx.Conn both have it.
type DB interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Client runs requests idempotently on a pool. It is safe for concurrent
// use.
type Client struct {
	db           DB
	cfg          config
	reserveSQL   string
	completeSQL  string
	timeLimitSQL string
}

// VersionError is returned by [New] when the extension is missing from the
// database or older than [MinExtensionVersion].
type VersionError struct {
	// Found is the installed version, "" when the extension is missing.
	Found string
}

func (e *VersionError) Error() string {
	if e.Found == "" {
		return `idempotency: extension "idempotency" is not installed in this database (CREATE EXTENSION idempotency); this library needs version ` + MinExtensionVersion + " or later"
	}
	return `idempotency: extension "idempotency" is version ` + e.Found + "; this library needs version " + MinExtensionVersion + " or later (ALTER EXTENSION idempotency UPDATE)"
}

// New checks the extension's version in the database and returns a client
// whose routes default to opts. It fails with a *[VersionError] where the
// extension is missing or older than 0.2.0, and with the first invalid
// option's error.
func New(ctx context.Context, db DB, opts ...Option) (*Client, error) {
	cfg := defaultConfig().with(opts)
	if len(cfg.errs) > 0 {
		return nil, cfg.errs[0]
	}
	var version, schema string
	err := db.QueryRow(ctx,
		`SELECT e.extversion, n.nspname FROM pg_catalog.pg_extension e
		 JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
		 WHERE e.extname = 'idempotency'`).Scan(&version, &schema)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &VersionError{}
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: checking the extension's version: %w", err)
	}
	if compareVersions(version, MinExtensionVersion) < 0 {
		return nil, &VersionError{Found: version}
	}
	s := pgx.Identifier{schema}.Sanitize()
	return &Client{
		db:  db,
		cfg: cfg,
		reserveSQL: "SELECT outcome, response_status, response FROM " + s +
			".idem_reserve($1::text, $2::text, $3::jsonb, scope => $4::text, ttl => $5::interval)",
		completeSQL: "SELECT " + s + ".idem_complete($1::text, $2::text, $3::jsonb, $4::integer, scope => $5::text)",
		timeLimitSQL: "SELECT pg_catalog.set_config('statement_timeout', $1::text, true), " +
			"pg_catalog.set_config('idle_in_transaction_session_timeout', $1::text, true)",
	}, nil
}

// compareVersions compares dotted version numbers ("0.2.0"); a part that is
// not a number counts as 0
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// Outcome is idem_reserve's answer.
type Outcome string

// The outcomes of idem_reserve.
const (
	OutcomeNew        Outcome = "new"
	OutcomeReplay     Outcome = "replay"
	OutcomeInProgress Outcome = "in_progress"
	OutcomeMismatch   Outcome = "mismatch"
	OutcomeStuck      Outcome = "stuck"
)

// The errors of [Client.BeginFunc] for the outcomes that do not run the
// function.
var (
	// ErrInProgress: another transaction holds the key (409 in-progress).
	ErrInProgress = errors.New("idempotency: a request with this key is in progress")
	// ErrMismatch: the key was used with another request (422 mismatch).
	ErrMismatch = errors.New("idempotency: the key was used with another request")
	// ErrStuck: a request with this key never finished (409 stuck).
	ErrStuck = errors.New("idempotency: a request with this key is stuck")
	// ErrUnavailable wraps the error of a database that cannot be used
	// now (503 unavailable): no pooled connection within
	// [WithAcquireTimeout], or the connection lost under the transaction.
	// It was rolled back; lost during COMMIT it is committed or not, which
	// the retry finds out.
	ErrUnavailable = errors.New("idempotency: the database connection was lost")
	// ErrTimeLimit: the request ran past [WithTimeLimit] and was rolled
	// back, its key freed (503 time-limit).
	ErrTimeLimit = errors.New("idempotency: the request ran past its time limit")
)

// Request identifies one idempotent call.
type Request struct {
	// Operation names the endpoint ("create-payment"), 1 to 63 bytes.
	Operation string
	// Scope is the principal the key belongs to.
	Scope string
	// Key is the idempotency key, 1 to 255 bytes of printable ASCII.
	Key string
	// Document is the JSON document whose fingerprint is stored and
	// compared ([RequestDocument] for HTTP); nil means no fingerprint.
	Document []byte
	// TTL is how long the completed record replays; 0 uses the client's
	// [WithTTL], or else the server's idempotency.default_ttl.
	TTL time.Duration
}

// Result is what [Client.BeginFunc] did.
type Result struct {
	// Outcome is idem_reserve's answer.
	Outcome Outcome
	// Response is the function's response (new) or the stored one
	// (replay).
	Response Response
	// Committed says that the response was completed and committed; false
	// for a retryable status, which was rolled back.
	Committed bool
	// raised says that the error returned with the result is fn's own
	raised bool
}

// BeginFunc runs fn idempotently, in the style of pgx.BeginFunc. It is the
// package's one core runner: [Client.Middleware] is a caller of it. It begins a
// transaction on the client's pool, calls idem_reserve and, on "new", calls
// fn with the transaction. When fn returns a response whose status is not
// retryable ([WithRetryable]) the response is stored with idem_complete (in
// the envelope of [EncodeEnvelope]) and the transaction committed; when fn
// returns an error or a retryable status, or panics, the transaction is
// rolled back (a panic goes on after the rollback), so the effect and the
// record vanish together and a retry is new again. An error that
// [WithFinalErrors] marks final, returned with a response, is completed
// with that response like a returned one (unless fn's own SQL failed in the
// transaction, which then cannot commit) and returned too, with
// Result.Committed true.
//
// On "replay" fn is not called and Result.Response is the stored response.
// "in_progress", "mismatch" and "stuck" return [ErrInProgress],
// [ErrMismatch] and [ErrStuck]; a response that cannot be stored is a
// *[CompletionError]; database errors are returned as they are
// (*pgconn.PgError). opts override the client's settings for this call.
//
// Once fn has returned, the completion and the COMMIT run on
// context.WithoutCancel(ctx): cancelling ctx then does not roll back an
// effect that is about to commit. Pass a context that cannot be cancelled
// (context.WithoutCancel) to protect fn's own statements too, as
// [Client.Middleware] does.
func (c *Client) BeginFunc(ctx context.Context, req Request, fn func(ctx context.Context, tx pgx.Tx) (Response, error), opts ...Option) (Result, error) {
	cfg := c.cfg
	if len(opts) > 0 {
		cfg = c.cfg.with(opts)
		if len(cfg.errs) > 0 {
			return Result{}, cfg.errs[0]
		}
	}
	return c.run(ctx, &cfg, req, fn, nil)
}

// run is BeginFunc with the route's settings; check, when not nil, is the
// caller's check of what it can send, before anything is completed
func (c *Client) run(ctx context.Context, cfg *config, req Request, fn func(context.Context, pgx.Tx) (Response, error), check func(Response) error) (res Result, err error) {
	begin, cancel := ctx, context.CancelFunc(func() {})
	if cfg.acquire > 0 {
		begin, cancel = context.WithTimeout(ctx, cfg.acquire)
	}
	tx, err := c.db.BeginTx(begin, cfg.txOptions)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(begin.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w: no connection within %v: %w", ErrUnavailable, cfg.acquire, err)
		}
		return res, err
	}
	done := false
	defer func() {
		// (read before the connection goes back to the pool: after a
		// COMMIT it is no longer ours)
		if !done && err != nil && !res.raised && tx.Conn().IsClosed() {
			// the connection was lost under the transaction
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if !done {
			// an error, a panic or a retryable status: nothing is kept
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	start := time.Now()
	if cfg.timeLimit > 0 {
		// the server ends a statement, or the session idle in the
		// transaction, past the limit: a hung handler cannot hold the key
		ms := strconv.FormatInt(max(cfg.timeLimit.Milliseconds(), 1), 10)
		if _, err = tx.Exec(ctx, c.timeLimitSQL, ms); err != nil {
			return res, err
		}
	}

	ttl := req.TTL
	if ttl == 0 {
		ttl = cfg.ttl
	}
	var ttlArg, docArg any
	if ttl > 0 {
		ttlArg = strconv.FormatInt(ttl.Microseconds(), 10) + " microseconds"
	}
	if req.Document != nil {
		docArg = string(req.Document)
	}
	var outcome string
	var status *int32
	var stored []byte
	if err = tx.QueryRow(ctx, c.reserveSQL, req.Operation, req.Key, docArg, req.Scope, ttlArg).
		Scan(&outcome, &status, &stored); err != nil {
		return res, err
	}
	res.Outcome = Outcome(outcome)
	switch res.Outcome {
	case OutcomeNew:
	case OutcomeReplay:
		code := 200
		if status != nil {
			code = int(*status)
		}
		res.Response, err = DecodeEnvelope(code, stored, cfg.replayHeaders)
		return res, err
	case OutcomeInProgress:
		return res, ErrInProgress
	case OutcomeMismatch:
		return res, ErrMismatch
	case OutcomeStuck:
		return res, ErrStuck
	default:
		return res, fmt.Errorf("idempotency: idem_reserve answered an unknown outcome %q", outcome)
	}

	fnCtx := ctx
	if cfg.timeLimit > 0 {
		var cancel context.CancelFunc
		fnCtx, cancel = context.WithDeadline(ctx, start.Add(cfg.timeLimit))
		defer cancel()
	}
	var raised error
	res.Response, raised = fn(fnCtx, tx)
	if cfg.timeLimit > 0 && time.Since(start) > cfg.timeLimit {
		return res, fmt.Errorf("%w of %v", ErrTimeLimit, cfg.timeLimit)
	}
	// from here on, the error returned is fn's own (raised) unless the
	// completion fails
	res.raised = raised != nil
	if raised != nil && (cfg.final == nil || res.Response.Status == 0 || !cfg.final(raised) ||
		tx.Conn().PgConn().TxStatus() == 'E') {
		// a raised error, or a final one whose transaction failed (its
		// own SQL raised): it cannot commit
		return res, raised
	}
	if check != nil {
		if err = check(res.Response); err != nil {
			res.raised = false
			return res, err
		}
	}
	if cfg.retryable(res.Response.Status) {
		return res, raised
	}
	if cfg.responseLimit > 0 && len(res.Response.Body) > cfg.responseLimit {
		res.raised = false
		return res, &CompletionError{Reason: fmt.Sprintf("the body of %d bytes is over the stored-response limit of %d", len(res.Response.Body), cfg.responseLimit)}
	}
	// From here on nobody may cancel: the effect is about to commit
	ctx = context.WithoutCancel(ctx)
	envelope, err := EncodeEnvelope(res.Response, cfg.replayHeaders)
	if err == nil {
		_, err = tx.Exec(ctx, c.completeSQL, req.Operation, req.Key, string(envelope), res.Response.Status, req.Scope)
		err = storeError(err)
	}
	if err == nil {
		done = true
		var pgErr *pgconn.PgError
		if err = tx.Commit(ctx); err != nil && !errors.As(err, &pgErr) && !errors.Is(err, pgx.ErrTxCommitRollback) {
			// lost during COMMIT: committed or not, the retry finds out
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	if err != nil {
		res.raised = false
		return res, err
	}
	res.Committed = true
	return res, raised
}
