-- Tables and role of the HTTP example (server.py).
--
-- Needs: CREATE EXTENSION idempotency (in a schema on search_path).

CREATE TABLE payments (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	account		text NOT NULL,
	order_id	text NOT NULL,
	amount		bigint NOT NULL CHECK (amount > 0),
	currency	text NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now()
);

-- The service connects as a role that can do what it needs and no more:
-- the GRANT recipe for an application role.
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_example_http_app') THEN
		CREATE ROLE idem_example_http_app LOGIN;
	END IF;
END
$$;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_complete(text, text, jsonb, integer, text, text)
	TO idem_example_http_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO idem_example_http_app;
GRANT SELECT, INSERT ON payments TO idem_example_http_app;
