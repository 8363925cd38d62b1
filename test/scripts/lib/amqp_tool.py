"""A small AMQP 0-9-1 client for test scripts, on pika (rmq_py_venv in
rabbitmq.sh gives a Python that has it).

  amqp_tool.py publish [--declare] URL QUEUE ID...
      one persistent message per ID (an ID given twice is published twice,
      as a publisher that retries does), message_id ID, body {"id": ID},
      each confirmed by the broker; --declare declares QUEUE first (a
      durable classic queue; rmq_declare_queue makes quorum queues)
  amqp_tool.py consume URL QUEUE [--prefetch N] [--nack ID]... [--hold] [--idle S]
      consumes until nothing came for S seconds (default 2), printing a line
      per delivery: "delivery ID redelivered=BOOL count=N" (count: the
      quorum queue's x-delivery-count header, 0 on a first delivery); acks
      each message except those whose ID is given with --nack, which are
      nacked with requeue every time; --hold acks nothing and, once it has
      N messages, prints "holding N" and waits to be killed
"""

import argparse
import json
import sys
import time

import pika


def connect(url):
    params = pika.URLParameters(url)
    params.connection_attempts = 3
    params.retry_delay = 1
    return pika.BlockingConnection(params)


def publish(args):
    conn = connect(args.url)
    ch = conn.channel()
    ch.confirm_delivery()
    if args.declare:
        ch.queue_declare(args.queue, durable=True)
    for mid in args.ids:
        ch.basic_publish(exchange="", routing_key=args.queue,
                         body=json.dumps({"id": mid}).encode(),
                         properties=pika.BasicProperties(message_id=mid, delivery_mode=2,
                                                         content_type="application/json"),
                         mandatory=True)
    print("published %d" % len(args.ids), flush=True)
    conn.close()


def consume(args):
    conn = connect(args.url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=args.prefetch)
    held = 0
    last = time.monotonic()
    for method, props, body in ch.consume(args.queue, inactivity_timeout=0.2):
        if method is None:
            if not args.hold and time.monotonic() - last > args.idle:
                break
            continue
        last = time.monotonic()
        mid = props.message_id or json.loads(body)["id"]
        count = (props.headers or {}).get("x-delivery-count", 0)
        print("delivery %s redelivered=%s count=%s" % (mid, method.redelivered, count), flush=True)
        if args.hold:
            held += 1
            if held == args.prefetch:
                print("holding %d" % held, flush=True)
                while True:
                    conn.sleep(1)
        elif mid in args.nack:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
    ch.cancel()
    conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("publish")
    p.add_argument("--declare", action="store_true")
    p.add_argument("url")
    p.add_argument("queue")
    p.add_argument("ids", nargs="+")
    p.set_defaults(run=publish)
    c = sub.add_parser("consume")
    c.add_argument("url")
    c.add_argument("queue")
    c.add_argument("--prefetch", type=int, default=10)
    c.add_argument("--nack", action="append", default=[])
    c.add_argument("--hold", action="store_true")
    c.add_argument("--idle", type=float, default=2.0)
    c.set_defaults(run=consume)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
