#!/usr/bin/env bash
# The demo: `bash test/demo.sh` (as root or a user with sudo).
#
# Installs what is missing, builds, installs, starts a throwaway cluster and
# plays the story the project grew from: a payment whose response is lost and
# retried, twenty concurrent clicks with one key, the same key with another
# amount, and a retry after the key expired.  Effects are counted in the
# database, not in responses.  Stops the cluster and cleans up at the end.

source "$(dirname "$0")/lib.sh"
idem_setup

sql() { as_test_user psql -X -q -v ON_ERROR_STOP=1 -At -F ' | ' "$@"; }

sql <<'SQL'
CREATE EXTENSION idempotency;
CREATE TABLE payments (
	id			bigserial PRIMARY KEY,
	order_id	text NOT NULL,
	amount		int NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now()
);

-- POST /payments with an Idempotency-Key, as one server-side call
CREATE FUNCTION create_payment(idem_key text, order_id text, amount int,
							   ttl interval DEFAULT NULL, work interval DEFAULT '0')
RETURNS TABLE (outcome text, http_status int, body jsonb)
LANGUAGE plpgsql AS $$
DECLARE
	r record;
	payment_id bigint;
BEGIN
	r := idem_reserve('create-payment', idem_key,
					  jsonb_build_object('order_id', order_id, 'amount', amount),
					  scope => 'account-42', ttl => ttl);
	IF r.outcome <> 'new' THEN
		RETURN QUERY SELECT r.outcome, r.http_status, r.response;
		RETURN;
	END IF;
	INSERT INTO payments (order_id, amount) VALUES (order_id, amount)
		RETURNING id INTO payment_id;
	PERFORM pg_sleep_for(work);			-- the gateway takes its time
	body := jsonb_build_object('payment_id', payment_id, 'status', 'paid', 'amount', amount);
	PERFORM idem_complete('create-payment', idem_key, body, 201, payment_id::text,
						  scope => 'account-42');
	RETURN QUERY SELECT 'new', 201, body;
END
$$;
SQL

charges() { sql -c "SELECT count(*) FROM payments WHERE order_id = '$1'"; }

echo
echo "== 1. The response is lost, the app retries"
echo "   first attempt (the client times out; this output never reaches it):"
sql -c "SELECT * FROM create_payment('7f0c78e5-d51c-4634-b03b-2f770e8013dc', 'order-842', 10000)" | sed 's/^/     /'
echo "   retry with the same Idempotency-Key:"
sql -c "SELECT * FROM create_payment('7f0c78e5-d51c-4634-b03b-2f770e8013dc', 'order-842', 10000)" | sed 's/^/     /'
echo "   charges for order-842: $(charges order-842)"

echo
echo "== 2. Twenty concurrent requests with one key (two tabs, a retrying proxy...)"
outdir=$(as_test_user mktemp -d "$IDEM_WORK/demo.XXXXXX")
for i in $(seq 1 20); do
	sql -c "SELECT outcome, http_status FROM create_payment('8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80', 'order-900', 2500, work => '300 ms')" \
		>"$outdir/$i" 2>&1 &
done
wait
sort "$outdir"/* | uniq -c | sed 's/^ */     /; s/ | / http /'
echo "   charges for order-900: $(charges order-900)"
echo "   a retry after the first finished:"
sql -c "SELECT outcome, http_status, body FROM create_payment('8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80', 'order-900', 2500)" | sed 's/^/     /'

echo
echo "== 3. The same key with another amount"
sql -c "SELECT outcome, http_status, body FROM create_payment('7f0c78e5-d51c-4634-b03b-2f770e8013dc', 'order-842', 25000)" | sed 's/^/     /'
echo "   (422: the client reused a key for another intent; nothing was charged, nothing leaked)"
echo "   charges for order-842: $(charges order-842)"

echo
echo "== 4. A retry after the key expired runs again (the documented contract)"
sql -c "SELECT outcome, http_status FROM create_payment('0d5c9a52-expiring', 'order-777', 990, ttl => '1 second')" | sed 's/^/     first:  /'
sql -c "SELECT outcome, http_status FROM create_payment('0d5c9a52-expiring', 'order-777', 990, ttl => '1 second')" | sed 's/^/     retry:  /'
sleep 1.2
sql -c "SELECT outcome, http_status FROM create_payment('0d5c9a52-expiring', 'order-777', 990)" | sed 's/^/     after expiry: /'
echo "   charges for order-777: $(charges order-777) (choose a ttl longer than any client's retry window)"

echo
echo "== The records"
sql -P footer=off -c "SELECT key, status, response_status, resource_id, expires_at > now() AS live FROM idem_keys ORDER BY created_at, key" | sed 's/^/     /'

# The story's guarantees, checked: exit non-zero if any failed
test "$(charges order-842)" = 1
test "$(charges order-900)" = 1
test "$(charges order-777)" = 2
echo
echo "demo: all effects as expected"
