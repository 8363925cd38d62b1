-- Tables and role of the demo apps of clients/<language>/demo (doc/clients.md).
--
-- Needs: CREATE EXTENSION idempotency (in a schema on search_path).

CREATE TABLE payments (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	account		text NOT NULL,
	order_id	text NOT NULL,
	amount		bigint NOT NULL CHECK (amount > 0),
	currency	text NOT NULL,
	status		text NOT NULL CHECK (status IN ('paid', 'declined')),
	created_at	timestamptz NOT NULL DEFAULT now()
);

-- The demo connects as a role that can do what it needs and no more: the
-- GRANT recipe for an application role (README, Security).
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_demo_app') THEN
		CREATE ROLE idem_demo_app LOGIN;
	END IF;
END
$$;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_complete(text, text, jsonb, integer, text, text)
	TO idem_demo_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO idem_demo_app;
GRANT SELECT, INSERT ON payments TO idem_demo_app;
