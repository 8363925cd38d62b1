// Package idempotency makes HTTP handlers and other operations safe to retry
// with the idempotency PostgreSQL extension, on pgx v5.
//
// The record of a request and its effect commit together or not at all: the
// library takes a connection from the pool, begins a transaction, calls
// idem_reserve, runs the handler with that transaction ([Tx]), stores the
// handler's response with idem_complete and commits, all on one connection.
// A crash leaves either the effect and its record or neither, and a retry of
// a completed request replays the stored response instead of running again.
//
// Two ways to use it:
//
//   - [Client.Middleware] is a func(http.Handler) http.Handler (net/http,
//     chi) that parses the Idempotency-Key header, fingerprints the request,
//     runs the handler inside the transaction on a context the client's
//     disconnect cannot cancel, buffers its response and sends it only after
//     COMMIT. Outcomes and errors are answered as application/problem+json
//     from a [Mapping] the application can change.
//   - [Client.BeginFunc] is the one core runner, without HTTP, in the style
//     of pgx.BeginFunc: the only code that reserves, runs, completes or
//     rolls back, and commits. The middleware is a caller of it.
//
// The behaviour (key syntax, fingerprint document, response envelope, the
// mapping) is the one every client of the extension shares, described in
// doc/clients.md of the extension's repository.
package idempotency
