// A small payment API that honours the Idempotency-Key header, in Go with
// pgx (v4, pgxpool).  The HTTP contract is doc/http.md's, the
// same for the Python, Node.js and Java services:
//
//	POST /payments   Idempotency-Key: <key>   X-Account-Id: <scope>
//	{"order_id": "order-842", "amount": 10000, "currency": "BRL"}
//
//	201 the payment was made; 402 the card was declined (final, replayed);
//	400 missing or invalid key (SQLSTATE 22023) or a bad body; 409 in
//	progress or stuck, with Retry-After; 422 the key was used with another
//	request; a retry gets the stored status and body with
//	"Idempotent-Replayed: true".
//
// The key is reserved, the payment written and the answer stored in one
// transaction (idem_reserve, INSERT, idem_complete), committed before the
// answer is sent.
//
// Run: PGHOST=... PGDATABASE=... ./payments [-port N] [-port-file F]
// [-max-seconds S].  It listens on 127.0.0.1 only and connects with libpq's
// environment variables or DATABASE_URL.  Behind a transaction-pooling
// PgBouncer, add statement_cache_mode=describe to the connection string.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

const (
	operation    = "create-payment"
	declineAbove = 1000000 // cents; larger payments are declined
	maxBody      = 64 * 1024
	maxLatencyMs = 5000
)

// answer is what the client is told: a status, an error code and sentence
type answer struct {
	status  int
	code    string
	message string
}

// The outcomes of idem_reserve that answer without running the effect
var refused = map[string]answer{
	"in_progress": {409, "in_progress", "a request with this Idempotency-Key is in progress; retry later"},
	"stuck":       {409, "stuck", "the outcome of the request with this Idempotency-Key is being checked"},
	"mismatch":    {422, "mismatch", "this Idempotency-Key was already used with another request"},
}

// SQLSTATEs of the extension (pgx: *pgconn.PgError's Code) and what the
// client is told; an empty message means the server's, which names the
// argument
var sqlstateHTTP = map[string]answer{
	"22023": {400, "invalid_request", ""},
	"ID003": refused["in_progress"], // idem_call's outcomes as errors
	"ID004": refused["mismatch"],
	"ID005": refused["stuck"],
	"ID001": {500, "internal_error", "internal error"}, // a bug in the caller
	"ID002": {500, "internal_error", "internal error"},
	"25006": {503, "read_only", "the database is read-only; retry later"},
}

// payment is a validated request body
type payment struct {
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// result is one POST /payments' answer
type result struct {
	status   int
	body     []byte
	replayed bool
}

func errorBody(code, message string) []byte {
	body, _ := json.Marshal(map[string]string{"error": code, "message": message})
	return body
}

// parsePayment checks the body: a JSON object with a non-empty order_id, a
// positive integer amount and a three-letter currency
func parsePayment(raw []byte) (payment, error) {
	var fields map[string]json.RawMessage
	var p payment
	if err := json.Unmarshal(raw, &fields); err != nil {
		return p, fmt.Errorf("the body is not a JSON object: %v", err)
	}
	if json.Unmarshal(fields["order_id"], &p.OrderID) != nil || p.OrderID == "" {
		return p, errors.New(`"order_id" must be a non-empty string`)
	}
	dec := json.NewDecoder(bytes.NewReader(fields["amount"]))
	dec.UseNumber()
	var amount json.Number
	if dec.Decode(&amount) != nil {
		return p, errors.New(`"amount" must be a positive integer (cents)`)
	}
	n, err := strconv.ParseInt(string(amount), 10, 64)
	if err != nil || n <= 0 {
		return p, errors.New(`"amount" must be a positive integer (cents)`)
	}
	p.Amount = n
	if json.Unmarshal(fields["currency"], &p.Currency) != nil || len(p.Currency) != 3 {
		return p, errors.New(`"currency" must be a three-letter code`)
	}
	return p, nil
}

type service struct {
	pool *pgxpool.Pool
}

// create runs one POST /payments in one transaction
func (s *service) create(ctx context.Context, scope, key string, request []byte, p payment, latency time.Duration) (result, error) {
	var res result
	err := s.pool.BeginFunc(ctx, func(tx pgx.Tx) error {
		var err error
		res, err = createInTx(ctx, tx, scope, key, request, p, latency)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if a, ok := sqlstateHTTP[pgErr.Code]; ok {
			message := a.message
			if message == "" {
				message = pgErr.Message
			}
			return result{status: a.status, body: errorBody(a.code, message)}, nil
		}
	}
	return res, err
}

func createInTx(ctx context.Context, tx pgx.Tx, scope, key string, request []byte, p payment, latency time.Duration) (result, error) {
	var outcome string
	var responseStatus *int32
	var response []byte
	err := tx.QueryRow(ctx,
		"SELECT outcome, response_status, response FROM idem_reserve($1, $2, $3::jsonb, scope => $4)",
		operation, key, string(request), scope).Scan(&outcome, &responseStatus, &response)
	if err != nil {
		return result{}, err
	}
	if outcome == "replay" {
		return result{status: int(*responseStatus), body: response, replayed: true}, nil
	}
	if a, ok := refused[outcome]; ok {
		return result{status: a.status, body: errorBody(a.code, a.message)}, nil
	}

	// new: this request owns the key
	res := result{status: 402, body: errorBody("card_declined", "the card was declined")}
	var resourceID *string
	if p.Amount <= declineAbove {
		// The body is built as jsonb, the form idem_complete stores, so
		// that replays are the same document
		var id int64
		err = tx.QueryRow(ctx,
			`INSERT INTO payments (account, order_id, amount, currency) VALUES ($1, $2, $3, $4)
			 RETURNING id, jsonb_build_object('id', id, 'order_id', order_id, 'amount', amount,
			                                  'currency', currency, 'status', 'paid')`,
			scope, p.OrderID, p.Amount, p.Currency).Scan(&id, &res.body)
		if err != nil {
			return result{}, err
		}
		res.status = 201
		rid := strconv.FormatInt(id, 10)
		resourceID = &rid
	}
	if latency > 0 {
		time.Sleep(latency)
	}
	_, err = tx.Exec(ctx, "SELECT idem_complete($1, $2, $3::jsonb, $4, $5, $6)",
		operation, key, string(res.body), res.status, resourceID, scope)
	return res, err
}

func reply(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

func (s *service) payments(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		reply(w, 404, errorBody("not_found", "not found"))
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		reply(w, 400, errorBody("bad_request", "the body is too large"))
		return
	}
	keys, present := r.Header["Idempotency-Key"]
	if !present {
		reply(w, 400, errorBody("missing_key", "the Idempotency-Key header is required"))
		return
	}
	scope := "public"
	if v, ok := r.Header["X-Account-Id"]; ok {
		scope = v[0]
	}
	p, err := parsePayment(raw)
	if err != nil {
		reply(w, 400, errorBody("bad_request", err.Error()))
		return
	}
	latencyMs := 0
	if v := r.Header.Get("X-Simulated-Latency-Ms"); v != "" {
		if latencyMs, err = strconv.Atoi(v); err != nil {
			reply(w, 400, errorBody("bad_request", "bad X-Simulated-Latency-Ms"))
			return
		}
	}
	if latencyMs < 0 {
		latencyMs = 0
	} else if latencyMs > maxLatencyMs {
		latencyMs = maxLatencyMs
	}

	// Not r.Context(): it is cancelled when the client hangs up, and pgx
	// would then roll back a payment that was about to commit, leaving the
	// client's retry to make it again instead of replaying its answer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.create(ctx, scope, keys[0], raw, p, time.Duration(latencyMs)*time.Millisecond)
	if err != nil {
		log.Printf("database error: %v", err)
		reply(w, 500, errorBody("internal_error", "internal error"))
		return
	}
	if res.replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if res.status == 409 || res.status == 503 {
		w.Header().Set("Retry-After", "1")
	}
	reply(w, res.status, res.body)
}

func main() {
	port := flag.Int("port", 0, "port to listen on (0: any free port)")
	portFile := flag.String("port-file", "", "write the port listened on here")
	maxSeconds := flag.Float64("max-seconds", 300, "stop after this long")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("server: ")

	config, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatalf("bad connection settings: %v", err)
	}
	config.MaxConns = 16
	pool, err := pgxpool.ConnectConfig(context.Background(), config)
	if err != nil {
		log.Fatalf("could not connect: %v", err)
	}
	defer pool.Close()
	svc := &service{pool: pool}

	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, []byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("/payments", svc.payments)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 404, errorBody("not_found", "not found"))
	})
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		log.Fatalf("could not listen: %v", err)
	}
	actual := listener.Addr().(*net.TCPAddr).Port
	if *portFile != "" {
		if err := os.WriteFile(*portFile+".tmp", []byte(fmt.Sprintf("%d\n", actual)), 0644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(*portFile+".tmp", *portFile); err != nil {
			log.Fatal(err)
		}
	}
	log.Printf("listening on 127.0.0.1:%d", actual)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case <-stop:
		case <-time.After(time.Duration(*maxSeconds * float64(time.Second))):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		server.Shutdown(ctx)
	}()
	if err := server.Serve(listener); err != http.ErrServerClosed {
		log.Fatal(err)
	}
	log.Printf("stopped")
}
