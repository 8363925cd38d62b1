package idempotency

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRunner: the core runner (BeginFunc, which the middleware calls) with
// plain functions, no web framework: two concurrent calls, stuck, a panic,
// a retryable status and a response it cannot store
func TestRunner(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, testPool)
	req := func(key string) Request {
		return Request{Operation: "runner", Scope: "acct-a", Key: key, Document: []byte(`{"n": 1}`)}
	}
	insert := func(status int) func(context.Context, pgx.Tx) (Response, error) {
		return func(ctx context.Context, tx pgx.Tx) (Response, error) {
			_, err := tx.Exec(ctx, "INSERT INTO effects (note) VALUES ('runner')")
			return Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"done": true}`)}, err
		}
	}

	t.Run("two concurrent calls: in_progress, then a replay", func(t *testing.T) {
		reset(t)
		inside, release := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			res, err := c.BeginFunc(ctx, req("c"), func(ctx context.Context, tx pgx.Tx) (Response, error) {
				resp, err := insert(201)(ctx, tx)
				close(inside)
				<-release
				return resp, err
			})
			if err == nil && (res.Outcome != OutcomeNew || !res.Committed) {
				err = errors.New("the first call was not new and committed")
			}
			first <- err
		}()
		<-inside
		runs := 0
		_, err := c.BeginFunc(ctx, req("c"), func(context.Context, pgx.Tx) (Response, error) {
			runs++
			return Response{Status: 201}, nil
		})
		close(release)
		if !errors.Is(err, ErrInProgress) || runs != 0 {
			t.Fatalf("the second call: %v, %d runs", err, runs)
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		res, err := c.BeginFunc(ctx, req("c"), insert(201))
		if err != nil || res.Outcome != OutcomeReplay || res.Response.Status != 201 || !jsonEqual(t, res.Response.Body, []byte(`{"done": true}`)) || effects(t) != 1 {
			t.Fatalf("the third call: %+v %v, %d effects", res, err, effects(t))
		}
	})
	t.Run("stuck", func(t *testing.T) {
		reset(t)
		if _, err := testPool.Exec(ctx, `SELECT idem_reserve('runner', 's', '{"n": 1}', scope => 'acct-a')`); err != nil {
			t.Fatal(err)
		}
		if _, err := testPool.Exec(ctx, "UPDATE idem_keys SET updated_at = '-infinity'"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.BeginFunc(ctx, req("s"), insert(201)); !errors.Is(err, ErrStuck) || effects(t) != 0 {
			t.Fatalf("%v, %d effects", err, effects(t))
		}
	})
	t.Run("a panic rolls back and goes on", func(t *testing.T) {
		reset(t)
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Fatalf("recovered %v", v)
				}
			}()
			_, _ = c.BeginFunc(ctx, req("p"), func(ctx context.Context, tx pgx.Tx) (Response, error) {
				_, _ = insert(201)(ctx, tx)
				panic("boom")
			})
		}()
		if effects(t)+records(t) != 0 {
			t.Fatal("a panic left rows")
		}
		if res, err := c.BeginFunc(ctx, req("p"), insert(201)); err != nil || res.Outcome != OutcomeNew || effects(t) != 1 {
			t.Fatalf("the retry: %+v %v", res, err)
		}
	})
	t.Run("a retryable status rolls back and is returned", func(t *testing.T) {
		reset(t)
		res, err := c.BeginFunc(ctx, req("r"), insert(503))
		if err != nil || res.Committed || res.Response.Status != 503 || effects(t)+records(t) != 0 {
			t.Fatalf("%+v %v", res, err)
		}
	})
	t.Run("a response the server cannot store is a CompletionError, rolled back", func(t *testing.T) {
		reset(t)
		_, err := c.BeginFunc(ctx, req("n"), func(ctx context.Context, tx pgx.Tx) (Response, error) {
			resp, err := insert(200)(ctx, tx)
			resp.Body = []byte(`{"a": "\u0000"}`)
			return resp, err
		})
		var ce *CompletionError
		if !errors.As(err, &ce) || effects(t)+records(t) != 0 {
			t.Fatalf("%v, %d effects", err, effects(t))
		}
		_, err = c.BeginFunc(ctx, req("h"), func(ctx context.Context, tx pgx.Tx) (Response, error) {
			resp, err := insert(200)(ctx, tx)
			resp.Header.Set("Location", "/a\r\nb")
			return resp, err
		}, WithReplayHeaders("location"))
		if !errors.As(err, &ce) || effects(t)+records(t) != 0 {
			t.Fatalf("a stored header with CR LF: %v", err)
		}
	})
	t.Run("the ttl of the request", func(t *testing.T) {
		reset(t)
		r := req("t")
		r.TTL = 2 * time.Hour
		if _, err := c.BeginFunc(ctx, r, insert(200)); err != nil {
			t.Fatal(err)
		}
		if n := count(t, "SELECT count(*) FROM idem_keys WHERE expires_at - updated_at BETWEEN '119 minutes' AND '121 minutes'"); n != 1 {
			t.Fatal("the request's ttl was not used")
		}
	})
}
