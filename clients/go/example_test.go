package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempotency "github.com/pg-idempotency/idempotency/clients/go"
)

// accountOf is the application's authentication: the principal of a
// request, here from a bearer token.
func accountOf(r *http.Request) (string, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	accounts := map[string]string{"token-a": "acct-a"}
	account, known := accounts[token]
	return account, ok && known
}

// A chi router whose POST /payments runs inside the key's transaction.
func ExampleClient_Middleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "") // libpq's environment: PGHOST, PGDATABASE, ...
	if err != nil {
		log.Fatal(err)
	}
	idem, err := idempotency.New(ctx, pool, idempotency.WithScope(accountOf)) // checks the extension's version
	if err != nil {
		log.Fatal(err)
	}

	r := chi.NewRouter()
	r.With(idem.Middleware(idempotency.WithOperation("create-payment"))).
		Post("/payments", func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			var id int64
			err := idempotency.Tx(ctx).QueryRow(ctx,
				"INSERT INTO payments (amount) VALUES (100) RETURNING id").Scan(&id)
			if err != nil {
				http.Error(w, "try again", http.StatusServiceUnavailable) // a 5xx rolls back
				return
			}
			w.Header().Set("Location", fmt.Sprintf("/payments/%d", id)) // replayed
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "status": "paid"})
		})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", r))
}

// A handler that returns its error: the transaction rolls back and the
// error is answered from the mapping (a serialization failure is 503 with
// Retry-After).
func ExampleHandlerFunc() {
	var idem *idempotency.Client // from idempotency.New
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/refunds", idem.Middleware()(idempotency.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) error {
			ctx := r.Context()
			if _, err := idempotency.Tx(ctx).Exec(ctx,
				"INSERT INTO refunds (order_id) VALUES ($1)", r.PathValue("id")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		})))
}

// The transaction runner without HTTP, as a queue consumer would use it.
func ExampleClient_BeginFunc() {
	ctx := context.Background()
	var idem *idempotency.Client // from idempotency.New
	res, err := idem.BeginFunc(ctx, idempotency.Request{
		Operation: "send-invoice",
		Scope:     "acct-a",
		Key:       "invoice-2024-0042",
		Document:  []byte(`{"invoice": 42}`),
	}, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO outbox (invoice) VALUES (42)"); err != nil {
			return idempotency.Response{}, err // rolled back: the retry runs again
		}
		return idempotency.Response{Status: 200}, nil
	})
	switch {
	case err != nil:
		log.Print(err) // idempotency.ErrInProgress, ErrMismatch, ErrStuck, or a database error
	case res.Outcome == idempotency.OutcomeReplay:
		log.Print("already sent")
	}
}

func ExampleParseKey() {
	for _, header := range [][]string{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`},
		{`"a\"b"`},
		{`"a", "b"`},
		{`"a"`, `"b"`},
	} {
		key, err := idempotency.ParseKey(header)
		fmt.Printf("%q %v\n", key, err)
	}
	// Output:
	// "8e03978e-40d5-43e8-bc93-6894a57f9324" <nil>
	// "8e03978e-40d5-43e8-bc93-6894a57f9324" <nil>
	// "a\"b" <nil>
	// "" idempotency: invalid Idempotency-Key: The Idempotency-Key has something after its closing quote: it must be one string, without parameters.
	// "" idempotency: invalid Idempotency-Key: The request has more than one Idempotency-Key header field.
}

func ExampleRequestDocument() {
	body := []byte(`{"order_id": "o-1", "amount": 100, "note": "gift"}`)
	whole, _ := idempotency.RequestDocument("post", "/payments", "application/json", body, nil)
	subset, _ := idempotency.RequestDocument("post", "/payments", "application/json", body, []string{"/order_id", "/amount"})
	text, _ := idempotency.RequestDocument("post", "/upload", "text/plain", []byte("hello"), nil)
	fmt.Println(string(whole))
	fmt.Println(string(subset))
	fmt.Println(string(text))
	// Output:
	// {"method":"POST","path":"/payments","body":{"order_id":"o-1","amount":100,"note":"gift"}}
	// {"method":"POST","path":"/payments","body":{"/amount":100,"/order_id":"o-1"}}
	// {"method":"POST","path":"/upload","body_base64":"aGVsbG8="}
}

func ExampleEncodeEnvelope() {
	resp := idempotency.Response{
		Status: 201,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/42"}, "Set-Cookie": {"s=1"}},
		Body:   []byte(`{"id": 42, "status": "paid"}`),
	}
	env, _ := idempotency.EncodeEnvelope(resp, map[string]bool{"content-type": true, "location": true})
	fmt.Println(string(env))
	// Output:
	// {"v":1,"headers":{"content-type":"application/json","location":"/payments/42"},"body":{"id":42,"status":"paid"}}
}
