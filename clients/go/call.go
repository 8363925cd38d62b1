package idempotency

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"

	"github.com/jackc/pgx/v5"
)

// Call runs fn once per key (doc/clients.md, "Message consumers and any
// function"), through the core runner [Client.BeginFunc]: it reserves
// (operation, key, scope) with req.Document as the request document, calls
// fn with the open transaction on "new", stores fn's value as JSON with
// response_status 200 and commits, and returns the value with
// [OutcomeNew]. A later call with the same key and document returns the
// stored value with [OutcomeReplay] and does not call fn; so does a record
// completed by the extension's idem_call or by plain SQL (a bare JSON
// value). fn's error rolls the transaction back (its effects and the key's
// record vanish together, and the next call runs fn again) and is returned
// as it is. The other outcomes are [ErrInProgress], [ErrMismatch] and
// [ErrStuck]; a value that cannot be stored (a string with \u0000, over
// [WithResponseLimit]) is a *[CompletionError], rolled back. opts override
// the client's settings ([WithTTL], [WithTimeLimit], [WithTxOptions], ...);
// every value fn returns without an error is completed, whatever
// [WithRetryable] says.
func Call[T any](ctx context.Context, c *Client, req Request, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (T, Outcome, error) {
	var value T
	opts = append(opts[:len(opts):len(opts)], WithRetryable(func(int) bool { return false }))
	res, err := c.BeginFunc(ctx, req, func(ctx context.Context, tx pgx.Tx) (Response, error) {
		v, err := fn(ctx, tx)
		if err != nil {
			return Response{}, err // no status: never completed, even for a final error
		}
		body, err := json.Marshal(v)
		if err != nil {
			return Response{}, err
		}
		value = v
		return Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}, nil
	}, opts...)
	if err != nil {
		var zero T
		return zero, res.Outcome, err
	}
	if res.Outcome == OutcomeReplay {
		value = *new(T)
		if len(res.Response.Body) > 0 {
			if err := json.Unmarshal(res.Response.Body, &value); err != nil {
				return value, res.Outcome, err
			}
		}
	}
	return value, res.Outcome, nil
}

// MessageDocument returns the request document of a message
// (doc/clients.md, "Message consumers and any function"): {"body": <JSON>}
// when contentType is JSON (application/json or a +json type) and the body
// parses, as in an HTTP request, otherwise {"body_base64": "..."} (padded
// base64; "" for an empty body).
func MessageDocument(contentType string, body []byte) []byte {
	var doc []byte
	if isJSON(contentType, body) {
		doc, _ = json.Marshal(struct {
			Body json.RawMessage `json:"body"`
		}{body})
	} else {
		doc, _ = json.Marshal(struct {
			BodyBase64 string `json:"body_base64"`
		}{base64.StdEncoding.EncodeToString(body)})
	}
	return doc
}
