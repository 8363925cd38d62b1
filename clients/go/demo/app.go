package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempotency "github.com/pg-idempotency/idempotency/clients/go"
)

const (
	declineAbove = 1000000 // cents; larger payments are declined
	maxLatencyMs = 5000
	maxBody      = 64 << 10
	problemType  = "https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md#the-demo-app"
)

// app is the payment API of doc/clients.md's demo
type app struct {
	pool   *pgxpool.Pool
	idem   *idempotency.Client
	tokens map[string]string // bearer token -> account
}

// parseTokens reads DEMO_TOKENS: comma-separated token=account pairs
func parseTokens(s string) map[string]string {
	if s == "" {
		s = "token-a=acct-a,token-b=acct-b"
	}
	tokens := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		if token, account, ok := strings.Cut(strings.TrimSpace(pair), "="); ok && token != "" && account != "" {
			tokens[token] = account
		}
	}
	return tokens
}

// account is the authenticated account of the request: the scope
func (a *app) account(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	account, ok := a.tokens[strings.TrimSpace(token)]
	return account, ok
}

// problem writes an application/problem+json answer
func problem(w http.ResponseWriter, status int, code, title, detail string) {
	body, _ := json.Marshal(map[string]any{
		"type": problemType, "title": title, "status": status, "detail": detail, "code": code,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// routes is the demo's router; bench adds the overhead benchmark's routes
func (a *app) routes(bench bool) http.Handler {
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.MaxBytesHandler(next, maxBody)
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		problem(w, 404, "not-found", "Not found", "There is nothing at this address.")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		problem(w, 405, "method-not-allowed", "Method not allowed", "This address does not take this method.")
	})
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]string{"status": "ok"})
	})
	// a declined card is a raised error marked final: the payment row
	// with status declined commits with the 402, and the retry replays it
	r.With(a.idem.Middleware(idempotency.WithOperation("create-payment"),
		idempotency.WithFinalErrors(func(err error) bool { return errors.Is(err, errCardDeclined) }),
		idempotency.WithErrorHandler(answerCardDeclined))).
		Method(http.MethodPost, "/payments", idempotency.HandlerFunc(a.createPayment))
	r.Get("/payments/{id}", a.getPayment)
	if bench {
		r.With(a.idem.Middleware(idempotency.WithOperation("bench-middleware"))).
			Method(http.MethodPost, "/bench/middleware", idempotency.HandlerFunc(a.benchMiddleware))
		r.Post("/bench/by-hand", a.benchByHand)
	}
	return r
}

// errCardDeclined is createPayment's error for a declined card
var errCardDeclined = errors.New("card declined")

// answerCardDeclined answers errCardDeclined with 402 card-declined; other
// errors are left to the library's mapping
func answerCardDeclined(w http.ResponseWriter, r *http.Request, err error) bool {
	if !errors.Is(err, errCardDeclined) {
		return false
	}
	problem(w, 402, "card-declined", "Card declined", "The card was declined.")
	return true
}

// payment is a payment as the API shows it
type payment struct {
	ID       int64  `json:"id"`
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

// parsePayment checks a request body: a JSON object with a non-empty
// order_id, a positive integer amount and a three-letter currency
func parsePayment(raw []byte) (payment, string) {
	var p payment
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return p, "The body must be a JSON object."
	}
	if json.Unmarshal(fields["order_id"], &p.OrderID) != nil || p.OrderID == "" {
		return p, `"order_id" must be a non-empty string.`
	}
	amount, err := strconv.ParseInt(string(fields["amount"]), 10, 64)
	if err != nil || amount <= 0 {
		return p, `"amount" must be a positive integer (cents).`
	}
	p.Amount = amount
	if json.Unmarshal(fields["currency"], &p.Currency) != nil || len(p.Currency) != 3 ||
		strings.Trim(p.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != "" {
		return p, `"currency" must be three letters.`
	}
	return p, ""
}

// createPayment is POST /payments, inside the key's transaction
func (a *app) createPayment(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	tx := idempotency.Tx(ctx)
	account, _ := a.account(r)
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	p, complaint := parsePayment(raw)
	latencyMs := 0
	if v := r.Header.Get("X-Simulated-Latency-Ms"); v != "" && complaint == "" {
		if latencyMs, err = strconv.Atoi(v); err != nil {
			complaint = "X-Simulated-Latency-Ms must be a number of milliseconds."
		}
		latencyMs = min(max(latencyMs, 0), maxLatencyMs)
	}
	if complaint != "" {
		// a final answer: the same body always gets the same 400
		problem(w, 400, "bad-request", "Not a payment", complaint)
		return nil
	}
	p.Status = "paid"
	if p.Amount > declineAbove {
		p.Status = "declined"
	}
	err = tx.QueryRow(ctx,
		`INSERT INTO payments (account, order_id, amount, currency, status)
		 VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		account, p.OrderID, p.Amount, p.Currency, p.Status).Scan(&p.ID)
	if err != nil {
		return err
	}
	if latencyMs > 0 {
		time.Sleep(time.Duration(latencyMs) * time.Millisecond)
	}
	if p.Status == "declined" {
		return errCardDeclined
	}
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(p.ID, 10))
	writeJSON(w, 201, p)
	return nil
}

// getPayment is GET /payments/{id}: the caller's account's payment, or 404
func (a *app) getPayment(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(r)
	if !ok {
		problem(w, 401, "unauthenticated", "Unauthenticated", "This request needs valid credentials.")
		return
	}
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	var p payment
	if err == nil {
		err = a.pool.QueryRow(r.Context(),
			`SELECT id, order_id, amount, currency, status FROM payments WHERE id = $1 AND account = $2`,
			id, account).Scan(&p.ID, &p.OrderID, &p.Amount, &p.Currency, &p.Status)
	}
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, strconv.ErrSyntax) || errors.Is(err, strconv.ErrRange) {
		problem(w, 404, "not-found", "Payment not found", "This account has no payment with this id.")
		return
	}
	if err != nil {
		problem(w, 500, "internal-error", "Internal error", "The request could not be processed.")
		return
	}
	writeJSON(w, 200, p)
}

// benchMiddleware is POST /bench/middleware: one INSERT, inside the
// middleware's transaction
func (a *app) benchMiddleware(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	key, _ := idempotency.ParseKey(r.Header.Values("Idempotency-Key"))
	var id int64
	if err := idempotency.Tx(ctx).QueryRow(ctx,
		"INSERT INTO bench_effects (k) VALUES ($1) RETURNING id", key).Scan(&id); err != nil {
		return err
	}
	writeJSON(w, 201, map[string]int64{"id": id})
	return nil
}

// benchByHand is POST /bench/by-hand: the same handler with idem_reserve,
// the INSERT and idem_complete written by hand in one transaction, without
// the library
func (a *app) benchByHand(w http.ResponseWriter, r *http.Request) {
	account, ok := a.account(r)
	if !ok {
		problem(w, 401, "unauthenticated", "Unauthenticated", "This request needs valid credentials.")
		return
	}
	key := strings.Trim(strings.TrimSpace(r.Header.Get("Idempotency-Key")), `"`)
	if key == "" {
		problem(w, 400, "missing-key", "Idempotency-Key missing", "This request needs an Idempotency-Key header.")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil || !json.Valid(body) {
		body = []byte("null")
	}
	doc := `{"method": "POST", "path": "/bench/by-hand", "body": ` + string(body) + `}`
	ctx := context.WithoutCancel(r.Context())
	var status int
	var out []byte
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var outcome string
		var stored *int32
		var response []byte
		if err := tx.QueryRow(ctx,
			`SELECT outcome, response_status, response -> 'body' FROM idem_reserve($1::text, $2::text, $3::jsonb, scope => $4::text)`,
			"bench-by-hand", key, doc, account).Scan(&outcome, &stored, &response); err != nil {
			return err
		}
		switch outcome {
		case "new":
		case "replay":
			status, out = int(*stored), response
			w.Header().Set("Idempotent-Replayed", "true")
			return nil
		case "mismatch":
			status, out = 422, []byte(`{"code": "mismatch"}`)
			return nil
		default:
			status, out = 409, []byte(`{"code": "in-progress"}`)
			return nil
		}
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO bench_effects (k) VALUES ($1) RETURNING id", key).Scan(&id); err != nil {
			return err
		}
		status, out = 201, []byte(`{"id":`+strconv.FormatInt(id, 10)+`}`)
		_, err := tx.Exec(ctx,
			`SELECT idem_complete($1::text, $2::text, $3::jsonb, 201, scope => $4::text)`,
			"bench-by-hand", key, `{"v": 1, "headers": {"content-type": "application/json"}, "body": `+string(out)+`}`, account)
		return err
	})
	if err != nil {
		problem(w, 500, "internal-error", "Internal error", "The request could not be processed.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}
