package idempotency

import (
	"encoding/json"
	"maps"
	"net/http"
	"strconv"
)

// ProblemTypeBase is the prefix of a problem's "type": doc/clients.md's
// anchor for the code follows it.
const ProblemTypeBase = "https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md#"

// The problem codes of the mapping (doc/clients.md, "The mapping, as data").
const (
	CodeMissingKey          = "missing-key"
	CodeInvalidKey          = "invalid-key"
	CodeUnauthenticated     = "unauthenticated"
	CodeInvalidRequest      = "invalid-request"
	CodeInProgress          = "in-progress"
	CodeStuck               = "stuck"
	CodeMismatch            = "mismatch"
	CodeReadOnly            = "read-only"
	CodeRetry               = "retry"
	CodeUnsupportedEnvelope = "unsupported-envelope"
	CodeInternalError       = "internal-error"
	// CodeUnavailable answers a database that cannot be reached or a
	// connection lost before COMMIT: nothing was kept (or, lost during
	// COMMIT, the retry replays).
	CodeUnavailable = "unavailable"
	// CodeTimeLimit answers a request that ran past WithTimeLimit: rolled
	// back, its key free for the retry.
	CodeTimeLimit = "time-limit"
	// CodePayloadTooLarge answers a body over the limit of an
	// http.MaxBytesReader installed before the middleware.
	CodePayloadTooLarge = "payload-too-large"
)

// Problem is one row of the mapping: how a case is answered, as an RFC 9457
// application/problem+json body.
type Problem struct {
	// Status is the HTTP status.
	Status int
	// Title is the problem's short summary.
	Title string
	// Detail is the sentence for the client; for invalid-request the
	// extension's message is used instead.
	Detail string
	// RetryAfter says whether the answer carries Retry-After, with the
	// seconds of [WithRetryAfter].
	RetryAfter bool
}

// Mapping is the table from outcomes and errors to HTTP answers, as data the
// application can change ([WithMapping], [WithProblem]).
type Mapping struct {
	// Problems holds each case's answer, by problem code.
	Problems map[string]Problem
	// SQLStates maps the SQLSTATE of a database error to a problem code;
	// any other error is internal-error.
	SQLStates map[string]string
}

// DefaultMapping returns a fresh copy of doc/clients.md's table.
func DefaultMapping() Mapping {
	return Mapping{
		Problems: map[string]Problem{
			CodeMissingKey:          {400, "Idempotency-Key missing", "This request needs an Idempotency-Key header.", false},
			CodeInvalidKey:          {400, "Invalid Idempotency-Key", "The Idempotency-Key header must be one string of printable ASCII.", false},
			CodeUnauthenticated:     {401, "Unauthenticated", "This request needs valid credentials.", false},
			CodeInvalidRequest:      {400, "Invalid request", "The request is not valid.", false},
			CodeInProgress:          {409, "Request in progress", "A request with this Idempotency-Key is still being processed.", true},
			CodeStuck:               {409, "Request stuck", "A request with this Idempotency-Key did not finish, and its outcome is being checked.", true},
			CodeMismatch:            {422, "Idempotency-Key reused", "This Idempotency-Key was already used with a different request.", false},
			CodeReadOnly:            {503, "Database read-only", "The database is read-only at the moment; retry later.", true},
			CodeRetry:               {503, "Conflict with a concurrent request", "The request conflicted with a concurrent one and was rolled back; retry it.", true},
			CodeUnsupportedEnvelope: {500, "Unsupported response envelope", "The stored response cannot be read by this version of the library.", false},
			CodeInternalError:       {500, "Internal error", "The request could not be processed.", false},
			CodePayloadTooLarge:     {413, "Request too large", "The request body is too large.", false},
			CodeUnavailable:         {503, "Database unavailable", "The database cannot be reached at the moment; retry later.", true},
			CodeTimeLimit:           {503, "Request time limit", "The request ran past its time limit and was rolled back; retry it.", true},
		},
		SQLStates: map[string]string{
			"22023": CodeInvalidRequest,
			// the server refusing the request document or the key as it
			// reads them (doc/clients.md, "Requests the server refuses")
			"22P02": CodeInvalidRequest,
			"22P05": CodeInvalidRequest,
			"22003": CodeInvalidRequest,
			"22021": CodeInvalidRequest,
			"54001": CodeInvalidRequest,
			"ID003": CodeInProgress,
			"ID004": CodeMismatch,
			"ID005": CodeStuck,
			"25006": CodeReadOnly,
			"40001": CodeRetry,
			"40P01": CodeRetry,
			// the server going away: connection exceptions, shutdown,
			// starting up (a connection that cannot be made or that is
			// lost without a SQLSTATE is unavailable too)
			"08000": CodeUnavailable,
			"08001": CodeUnavailable,
			"08003": CodeUnavailable,
			"08004": CodeUnavailable,
			"08006": CodeUnavailable,
			"57P01": CodeUnavailable,
			"57P02": CodeUnavailable,
			"57P03": CodeUnavailable,
		},
	}
}

// clone returns a deep copy, so that options never share maps
func (m Mapping) clone() Mapping {
	return Mapping{Problems: maps.Clone(m.Problems), SQLStates: maps.Clone(m.SQLStates)}
}

// problemBody is the RFC 9457 document
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// problemResponse builds the answer for a problem code; detail, when not
// empty, replaces the mapping's
func (c *config) problemResponse(code, detail string) Response {
	p, ok := c.mapping.Problems[code]
	if !ok {
		p, ok = c.mapping.Problems[CodeInternalError]
		if !ok {
			p = DefaultMapping().Problems[CodeInternalError]
		}
	}
	if detail == "" {
		detail = p.Detail
	}
	body, _ := json.Marshal(problemBody{ProblemTypeBase + code, p.Title, p.Status, detail, code})
	h := http.Header{"Content-Type": {"application/problem+json"}}
	if p.RetryAfter && c.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(c.retryAfter))
	}
	return Response{Status: p.Status, Header: h, Body: body}
}
