package idempotency

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

type shipment struct {
	ID    int64  `json:"id"`
	Order string `json:"order"`
}

// TestCall: any function under a key, against the real extension: new,
// replay (the first value, fn not run), an error rolls back, two
// concurrent calls (one runs, in_progress for the other), mismatch, and a
// record written by the extension's idem_call read back as its value
func TestCall(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, testPool)
	req := func(key, doc string) Request {
		return Request{Operation: "ship", Scope: "acct-a", Key: key, Document: []byte(doc)}
	}
	runs := 0
	ship := func(ctx context.Context, tx pgx.Tx) (shipment, error) {
		runs++
		var s shipment
		err := tx.QueryRow(ctx, "INSERT INTO effects (note) VALUES ('ship') RETURNING id").Scan(&s.ID)
		s.Order = "o-1"
		return s, err
	}

	t.Run("new, then replay of the first value", func(t *testing.T) {
		reset(t)
		runs = 0
		first, outcome, err := Call(ctx, c, req("k1", `{"order": "o-1"}`), ship)
		if err != nil || outcome != OutcomeNew || first.ID == 0 || first.Order != "o-1" {
			t.Fatalf("first: %+v %s %v", first, outcome, err)
		}
		again, outcome, err := Call(ctx, c, req("k1", `{"order": "o-1"}`), ship)
		if err != nil || outcome != OutcomeReplay || again != first || runs != 1 || effects(t) != 1 {
			t.Fatalf("replay: %+v %s %v, %d runs, %d effects", again, outcome, err, runs, effects(t))
		}
		if got := count(t, "SELECT count(*) FROM idem_keys WHERE key = 'k1' AND status = 'completed' AND response_status = 200 AND response->'body' = $1::jsonb",
			`{"id": `+strconv.FormatInt(first.ID, 10)+`, "order": "o-1"}`); got != 1 {
			t.Fatalf("the stored record: %d", got)
		}
		if _, _, err := Call(ctx, c, req("k1", `{"order": "o-2"}`), ship); !errors.Is(err, ErrMismatch) || runs != 1 {
			t.Fatalf("another document: %v, %d runs", err, runs)
		}
	})

	t.Run("an error rolls back the effect and the record", func(t *testing.T) {
		reset(t)
		boom := errors.New("boom")
		_, outcome, err := Call(ctx, c, req("k2", `{}`), func(ctx context.Context, tx pgx.Tx) (shipment, error) {
			s, err := ship(ctx, tx)
			if err == nil {
				err = boom
			}
			return s, err
		})
		if !errors.Is(err, boom) || outcome != OutcomeNew || effects(t) != 0 || count(t, "SELECT count(*) FROM idem_keys") != 0 {
			t.Fatalf("%s %v, %d effects", outcome, err, effects(t))
		}
		if _, outcome, err := Call(ctx, c, req("k2", `{}`), ship); err != nil || outcome != OutcomeNew || effects(t) != 1 {
			t.Fatalf("the retry: %s %v, %d effects", outcome, err, effects(t))
		}
	})

	t.Run("two concurrent calls: one runs, in_progress for the other", func(t *testing.T) {
		reset(t)
		inside, release := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, _, err := Call(ctx, c, req("k3", `{}`), func(ctx context.Context, tx pgx.Tx) (shipment, error) {
				s, err := ship(ctx, tx)
				close(inside)
				<-release
				return s, err
			})
			first <- err
		}()
		<-inside
		ran := false
		_, outcome, err := Call(ctx, c, req("k3", `{}`), func(context.Context, pgx.Tx) (shipment, error) {
			ran = true
			return shipment{}, nil
		})
		close(release)
		if !errors.Is(err, ErrInProgress) || outcome != OutcomeInProgress || ran {
			t.Fatalf("the second call: %s %v, ran %v", outcome, err, ran)
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if effects(t) != 1 {
			t.Fatalf("%d effects", effects(t))
		}
	})

	t.Run("a record written by idem_call is a duplicate", func(t *testing.T) {
		reset(t)
		if _, err := testPool.Exec(ctx, `CREATE OR REPLACE FUNCTION call_test_ship(request jsonb) RETURNS jsonb
			LANGUAGE sql AS $$ INSERT INTO effects (note) VALUES ('sql') RETURNING jsonb_build_object('id', id, 'order', 'o-sql') $$`); err != nil {
			t.Fatal(err)
		}
		defer testPool.Exec(ctx, "DROP FUNCTION call_test_ship(jsonb)")
		var stored []byte
		if err := testPool.QueryRow(ctx, "SELECT idem_call('ship', 'k4', '{}'::jsonb, 'call_test_ship(jsonb)'::regprocedure, 'acct-a')::text").Scan(&stored); err != nil {
			t.Fatal(err)
		}
		runs = 0
		got, outcome, err := Call(ctx, c, req("k4", `{}`), ship)
		if err != nil || outcome != OutcomeReplay || got.Order != "o-sql" || got.ID == 0 || runs != 0 || effects(t) != 1 {
			t.Fatalf("%+v %s %v, %d runs, %d effects (idem_call stored %s)", got, outcome, err, runs, effects(t), stored)
		}
	})
}

// TestMessageDocument: a message's request document follows the HTTP body
// rule: the content type decides, and the bytes must parse
func TestMessageDocument(t *testing.T) {
	for _, c := range []struct{ contentType, body, want string }{
		{"application/json", `{"b": 1, "a": [true]}`, `{"body":{"b":1,"a":[true]}}`},
		{"application/vnd.order+json; charset=utf-8", `[1]`, `{"body":[1]}`},
		{"application/json", `{"a":`, `{"body_base64":"eyJhIjo="}`},
		{"text/plain", `{"a": 1}`, `{"body_base64":"eyJhIjogMX0="}`},
		{"", `{"a": 1}`, `{"body_base64":"eyJhIjogMX0="}`},
		{"application/json", ``, `{"body_base64":""}`},
	} {
		if got := string(MessageDocument(c.contentType, []byte(c.body))); got != c.want {
			t.Errorf("MessageDocument(%q, %q) = %s, want %s", c.contentType, c.body, got, c.want)
		}
	}
}
