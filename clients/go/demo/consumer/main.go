// Command consumer is the demo of package idemamqp, and the program
// test/scripts/consumer_go.sh runs, crashes and restarts: it consumes a
// RabbitMQ queue with the idempotent consumer and inserts one row per
// message into consumer_effects (created by the caller, with no unique
// constraint: a message handled twice shows as two rows). It connects to
// PostgreSQL with libpq's environment and exits after --idle with no
// delivery. A message whose id begins with "poison" always fails.
//
// For the crash tests, --crash MODE --crash-at N ends the process at the
// Nth delivery it handles: after-commit (SIGKILL of itself after COMMIT,
// before the ACK goes out), before-commit (after the INSERT, before the
// COMMIT), mid-handler (writes --crash-file and sleeps, for the caller's
// kill -9).
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	idempotency "github.com/pg-idempotency/idempotency/clients/go"
	"github.com/pg-idempotency/idempotency/clients/go/idemamqp"
)

var (
	url       = flag.String("url", "amqp://guest:guest@127.0.0.1:5672/", "the broker")
	queue     = flag.String("queue", "orders", "the queue")
	prefetch  = flag.Int("prefetch", 10, "the channel's prefetch count")
	workers   = flag.Int("workers", 4, "goroutines handling deliveries")
	idle      = flag.Duration("idle", 3*time.Second, "exit after this long with no delivery")
	crash     = flag.String("crash", "", "after-commit, before-commit or mid-handler")
	crashAt   = flag.Int64("crash-at", 1, "the delivery handled at which to crash")
	crashFile = flag.String("crash-file", "", "mid-handler: written when the handler waits to be killed")
)

var handled atomic.Int64

// ordinal is the context key of the delivery's number in this process
type ordinal struct{}

func suicide() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// crashingAck ends the process when the delivery is acknowledged: after
// its COMMIT, before the broker hears of it
type crashingAck struct{ amqp.Acknowledger }

func (a crashingAck) Ack(tag uint64, multiple bool) error { suicide(); return nil }

func main() {
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	idem, err := idempotency.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := idemamqp.New(idem, "ship-orders",
		func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
			if strings.HasPrefix(d.MessageId, "poison") {
				return errors.New("this message always fails")
			}
			n, _ := ctx.Value(ordinal{}).(int64)
			if *crash == "mid-handler" && n == *crashAt {
				if err := os.WriteFile(*crashFile, []byte("waiting\n"), 0o644); err != nil {
					log.Fatal(err)
				}
				time.Sleep(time.Minute)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO consumer_effects (message_id, body) VALUES ($1, $2)",
				d.MessageId, string(d.Body)); err != nil {
				return err
			}
			if *crash == "before-commit" && n == *crashAt {
				suicide()
			}
			return nil
		},
		idemamqp.WithRetryDelay(200*time.Millisecond),
		idemamqp.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	if err != nil {
		log.Fatal(err)
	}

	conn, err := amqp.Dial(*url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(*prefetch, 0, false); err != nil {
		log.Fatal(err)
	}
	tag := "consumer-" + strconv.Itoa(os.Getpid())
	deliveries, err := ch.Consume(*queue, tag, false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}

	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for d := range deliveries {
				last.Store(time.Now().UnixNano())
				n := handled.Add(1)
				if *crash == "after-commit" && n == *crashAt {
					d.Acknowledger = crashingAck{d.Acknowledger}
				}
				consumer.Handle(context.WithValue(ctx, ordinal{}, n), d)
				last.Store(time.Now().UnixNano())
			}
		})
	}
	for time.Since(time.Unix(0, last.Load())) < *idle {
		time.Sleep(100 * time.Millisecond)
	}
	if err := ch.Cancel(tag, false); err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	consumer.Wait()
	log.Printf("consumer: %d deliveries handled", handled.Load())
}
