// Package idemamqp runs RabbitMQ message handlers
// (github.com/rabbitmq/amqp091-go deliveries) once per message with the
// idempotency PostgreSQL extension (doc/clients.md, "Message consumers and
// any function"): the handler runs inside the transaction that records the
// message's key, the delivery is acknowledged only after COMMIT, a
// duplicate is acknowledged without running the handler, an error rolls
// back and is requeued (the queue's delivery limit dead-letters a message
// that always fails), a redelivery racing the first is requeued after a
// delay and never run twice, and a key used with another body is rejected
// without requeue. It is a caller of the package's core runner,
// [idempotency.Client.BeginFunc].
package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	idempotency "github.com/pg-idempotency/idempotency/clients/go"
)

// Handler handles one delivery inside the transaction that records its key.
// Its error rolls the transaction back and the delivery is requeued.
type Handler func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error

// DefaultRetryDelay is how long a delivery whose key is in progress (or
// stuck) waits before it is requeued.
const DefaultRetryDelay = 500 * time.Millisecond

// Consumer handles deliveries idempotently. It is safe for concurrent use.
type Consumer struct {
	idem      *idempotency.Client
	operation string
	handler   Handler
	key       func(amqp.Delivery) (string, bool)
	scope     func(amqp.Delivery) string
	delay     time.Duration
	log       *slog.Logger
	opts      []idempotency.Option
	pending   sync.WaitGroup
}

// Option configures a Consumer.
type Option func(*Consumer)

// WithKeyHeader takes the key from the message header name (a string, or
// bytes) instead of its MessageId.
func WithKeyHeader(name string) Option {
	return WithKeyFunc(func(d amqp.Delivery) (string, bool) {
		switch v := d.Headers[name].(type) {
		case string:
			return v, v != ""
		case []byte:
			return string(v), len(v) > 0
		}
		return "", false
	})
}

// WithKeyFunc takes the key from a function of the delivery; ok false (or
// an empty key) rejects the delivery without requeue.
func WithKeyFunc(key func(d amqp.Delivery) (key string, ok bool)) Option {
	return func(c *Consumer) { c.key = key }
}

// WithScope sets the scope of every key (default "").
func WithScope(scope string) Option {
	return WithScopeFunc(func(amqp.Delivery) string { return scope })
}

// WithScopeFunc takes the scope of the key from a function of the delivery
// (a tenant header, the exchange).
func WithScopeFunc(scope func(d amqp.Delivery) string) Option {
	return func(c *Consumer) { c.scope = scope }
}

// WithRetryDelay sets how long a delivery whose key is in progress or stuck
// waits before it is requeued (DefaultRetryDelay).
func WithRetryDelay(d time.Duration) Option {
	return func(c *Consumer) { c.delay = d }
}

// WithLogger sets where rejected and failed deliveries are logged
// (slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *Consumer) { c.log = l }
}

// WithRunnerOptions passes options to the core runner for every delivery
// (idempotency.WithTTL, WithTimeLimit, WithTxOptions, ...).
func WithRunnerOptions(opts ...idempotency.Option) Option {
	return func(c *Consumer) { c.opts = append(c.opts, opts...) }
}

// New returns a Consumer whose keys belong to operation (it names the
// consumer: "ship-orders"), and whose key is a delivery's MessageId unless
// an option says otherwise.
func New(idem *idempotency.Client, operation string, handler Handler, opts ...Option) (*Consumer, error) {
	if idem == nil || handler == nil {
		return nil, errors.New("idemamqp: New needs a client and a handler")
	}
	if operation == "" || len(operation) > 63 {
		return nil, fmt.Errorf("idemamqp: the operation %q must be 1 to 63 bytes", operation)
	}
	c := &Consumer{idem: idem, operation: operation, handler: handler, delay: DefaultRetryDelay, log: slog.Default(),
		key:   func(d amqp.Delivery) (string, bool) { return d.MessageId, d.MessageId != "" },
		scope: func(amqp.Delivery) string { return "" }}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Disposition is what Handle did with a delivery.
type Disposition string

// The dispositions of a delivery.
const (
	Acked    Disposition = "acked"    // new and committed, or a duplicate (replay)
	Requeued Disposition = "requeued" // nacked with requeue: an error, in progress, stuck
	Rejected Disposition = "rejected" // rejected without requeue: no key, a bad key, mismatch
)

// Handle runs the handler for one delivery under its key and settles the
// delivery: Ack after COMMIT (or for a duplicate), Nack with requeue after
// an error and ROLLBACK, Nack with requeue after the retry delay when the
// key is in progress or stuck, Reject without requeue for a delivery
// without a key, with a key the extension refuses, or whose key was used
// with another body (mismatch). It returns what it did and the error
// behind a requeue or a reject (nil for an ack), or the error of the
// broker's acknowledgement. Consume with autoAck false.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) (Disposition, error) {
	key, ok := c.key(d)
	if !ok || key == "" {
		c.log.Warn("idemamqp: a message without a key, rejected", "operation", c.operation, "delivery_tag", d.DeliveryTag)
		return Rejected, errors.Join(errors.New("idemamqp: the message has no key"), d.Reject(false))
	}
	req := idempotency.Request{Operation: c.operation, Scope: c.scope(d), Key: key,
		Document: idempotency.MessageDocument(d.ContentType, d.Body)}
	ran := false
	_, err := c.idem.BeginFunc(ctx, req, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
		ran = true
		if err := c.handler(ctx, tx, d); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 200}, nil
	}, append(c.opts[:len(c.opts):len(c.opts)], idempotency.WithRetryable(func(int) bool { return false }))...)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		// new and committed, or a duplicate: only now is it acknowledged
		return Acked, d.Ack(false)
	case errors.Is(err, idempotency.ErrInProgress), errors.Is(err, idempotency.ErrStuck):
		// a redelivery racing the first (or a first that never finished):
		// later, never twice at once
		c.pending.Add(1)
		time.AfterFunc(c.delay, func() {
			defer c.pending.Done()
			if nerr := d.Nack(false, true); nerr != nil {
				c.log.Warn("idemamqp: nack failed", "operation", c.operation, "key", key, "error", nerr)
			}
		})
		return Requeued, err
	case errors.Is(err, idempotency.ErrMismatch):
		c.log.Error("idemamqp: the key was used with another message, rejected", "operation", c.operation, "scope", req.Scope, "key", key)
		return Rejected, errors.Join(err, d.Reject(false))
	case !ran && errors.As(err, &pgErr) && pgErr.Code == "22023":
		// a key or scope the extension refuses: it never will
		c.log.Error("idemamqp: a key the extension refuses, rejected", "operation", c.operation, "key", key, "error", err)
		return Rejected, errors.Join(err, d.Reject(false))
	default:
		// rolled back: the broker redelivers it, and dead-letters it past
		// the queue's delivery limit
		c.log.Warn("idemamqp: the handler failed, requeued", "operation", c.operation, "key", key, "error", err)
		return Requeued, errors.Join(err, d.Nack(false, true))
	}
}

// Wait waits for the delayed requeues Handle started (in progress, stuck):
// call it before closing the channel.
func (c *Consumer) Wait() { c.pending.Wait() }

// Run handles deliveries one after another until the channel closes or ctx
// ends, then waits for the delayed requeues it started. Run several
// goroutines (or processes) on one channel for concurrency.
func (c *Consumer) Run(ctx context.Context, deliveries <-chan amqp.Delivery) error {
	defer c.pending.Wait()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok := <-deliveries:
			if !ok {
				return nil
			}
			c.Handle(ctx, d)
		}
	}
}
