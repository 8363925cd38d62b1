-- A walk through create_payment (payments.sql): run with psql after it.
\pset null '(null)'
\set account '''6f1c1a52-1b5e-4a4e-9b1f-3c2f0d7a9e10'''
\set other '''0b9a2f3e-5d41-4c6a-8e7b-1a2b3c4d5e6f'''

\echo '1. The first attempt creates the payment: 201'
SELECT * FROM create_payment(:account, '8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80',
	'{"order_id": "order-842", "amount": 10000, "currency": "BRL"}');

\echo '2. The answer was lost and the app retries with the same key: the same'
\echo '   answer, and no second payment (key order and spacing do not matter)'
SELECT * FROM create_payment(:account, '8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80',
	'{"currency": "BRL",  "amount": 10000, "order_id": "order-842"}');
SELECT count(*) AS payments_for_order_842 FROM payments WHERE order_id = 'order-842';

\echo '3. The same key with another amount is a client bug: 422, nothing happens'
SELECT * FROM create_payment(:account, '8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80',
	'{"order_id": "order-842", "amount": 25000, "currency": "BRL"}');

\echo '4. Keys are scoped by account: another account may use the same key'
SELECT * FROM create_payment(:other, '8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80',
	'{"order_id": "order-842", "amount": 10000, "currency": "BRL"}');

\echo '5. A declined card is a final answer: 402, replayed like a success'
SELECT * FROM create_payment(:account, 'a1d0c6e8-3f5b-4d2a-9c7e-2b8f1e0d4c3a',
	'{"order_id": "order-900", "amount": 5000000, "currency": "BRL"}');
SELECT * FROM create_payment(:account, 'a1d0c6e8-3f5b-4d2a-9c7e-2b8f1e0d4c3a',
	'{"order_id": "order-900", "amount": 5000000, "currency": "BRL"}');

\echo '6. A retry that fails its own transaction changes nothing'
BEGIN;
SELECT * FROM create_payment(:account, 'c3f2e1d0-9b8a-4c7d-8e6f-5a4b3c2d1e0f',
	'{"order_id": "order-901", "amount": 100, "currency": "BRL"}');
ROLLBACK;
SELECT count(*) AS keys_after_rollback FROM idem_keys
WHERE key = 'c3f2e1d0-9b8a-4c7d-8e6f-5a4b3c2d1e0f';
SELECT * FROM create_payment(:account, 'c3f2e1d0-9b8a-4c7d-8e6f-5a4b3c2d1e0f',
	'{"order_id": "order-901", "amount": 100, "currency": "BRL"}');

\echo '7. idem_call runs the handler once and replays its result'
SELECT idem_call('create-payment-v2', 'f47ac10b-58cc-4372-a567-0e02b2c3d479',
	'{"account_id": "6f1c1a52-1b5e-4a4e-9b1f-3c2f0d7a9e10", "order_id": "order-77", "amount": 500, "currency": "BRL"}',
	'create_payment_handler(jsonb)', scope => :account);
SELECT idem_call('create-payment-v2', 'f47ac10b-58cc-4372-a567-0e02b2c3d479',
	'{"account_id": "6f1c1a52-1b5e-4a4e-9b1f-3c2f0d7a9e10", "order_id": "order-77", "amount": 500, "currency": "BRL"}',
	'create_payment_handler(jsonb)', scope => :account);

\echo 'The records and the payments'
SELECT operation, key, status, response_status, resource_id
FROM idem_keys ORDER BY created_at, operation, scope, key;
SELECT id, order_id, amount, currency FROM payments ORDER BY id;
