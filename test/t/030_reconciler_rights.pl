# The worker and a non-superuser owner of idem_keys (issue 29, items 1 and
# 5).  The owner attaches a trigger to idem_keys; a superuser's reconciler
# would run it as the superuser inside its idem_complete, and the owner
# would be SUPERUSER one pass later.  The worker skips that reconciler with
# a WARNING naming the owner and the table, and the owner gains nothing.
# With the grants doc/security.md lists (USAGE on the extension's schema
# and on each reconciler's schema, SELECT on idem_reconcilers), the worker
# maintains that table and runs a reconciler of a role the owner can act
# as; without USAGE on the reconciler's schema, the call fails with a
# WARNING and the record stays stuck.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node wait_for log_errors);

my $node = start_node('reconciler_rights', q{
idempotency.sweep_interval = '300ms'
idempotency.processing_timeout = '100ms'
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});

# keys_owner may act as payments (SET ROLE) without inheriting its rights,
# as a membership WITH INHERIT FALSE makes it from PostgreSQL 16 on
$node->safe_psql('postgres', q{
CREATE ROLE keys_owner LOGIN NOINHERIT;
CREATE ROLE payments;
GRANT payments TO keys_owner;
CREATE DATABASE shop;
});
# The README's install, then idem_keys given to keys_owner with the grants
# doc/security.md lists for it
$node->safe_psql('shop', q{
CREATE SCHEMA idem;
CREATE EXTENSION idempotency SCHEMA idem;
ALTER TABLE idem.idem_keys OWNER TO keys_owner;
GRANT USAGE ON SCHEMA idem TO keys_owner;
GRANT SELECT ON idem.idem_reconcilers TO keys_owner;
CREATE SCHEMA app;
GRANT USAGE ON SCHEMA app TO keys_owner;
CREATE SCHEMA owner_code AUTHORIZATION keys_owner;
CREATE TABLE public.trigger_runs (who name, super boolean);
GRANT INSERT ON public.trigger_runs TO PUBLIC;
});

# 1. A superuser's reconciler, and the owner's trigger that tries to make
# the owner SUPERUSER whenever it runs
$node->safe_psql('shop', q{
CREATE FUNCTION app.reconcile_su(r idem.idem_keys) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM idem.idem_complete(r.operation, r.key, '{"by": "superuser"}', 200, NULL, r.scope);
END $$;
SELECT idem.idem_set_reconciler('pay-su', 'app.reconcile_su(idem.idem_keys)');
});
$node->safe_psql('shop', q{
CREATE FUNCTION owner_code.escalate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.trigger_runs
		SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
	BEGIN
		ALTER ROLE keys_owner SUPERUSER;
	EXCEPTION WHEN insufficient_privilege THEN
		NULL;
	END;
	RETURN NEW;
END $$;
CREATE TRIGGER escalate BEFORE UPDATE ON idem.idem_keys
	FOR EACH ROW EXECUTE FUNCTION owner_code.escalate();
}, extra_params => [ '-U', 'keys_owner' ]);

my $offset = -s $node->logfile;
$node->safe_psql('shop', q{SELECT idem.idem_reserve('pay-su', 'k1')});
my $skipped = qr/WARNING:  reconciler app\.reconcile_su\(idem\.idem_keys\) of operation "pay-su" was skipped\n.*DETAIL:  Role "keys_owner" owns table "idem_keys", whose triggers, rules, policies, constraints, defaults and indexes run inside the reconciler's writes, and may not act as role "[^"]+", which it runs as\./;
ok( $node->wait_for_log($skipped, $offset),
	'worker: a superuser\'s reconciler is skipped while a non-superuser owns idem_keys');
is($node->safe_psql('shop', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'keys_owner'}),
	'f', 'the owner of idem_keys did not become SUPERUSER');
is($node->safe_psql('shop', q{SELECT count(*) FROM public.trigger_runs WHERE super}),
	'0', 'its trigger never ran as a superuser');
is($node->safe_psql('shop', q{SELECT count(*) > 0 FROM public.trigger_runs WHERE who = 'keys_owner'}),
	't', 'the worker\'s flag ran it as the owner');
is($node->safe_psql('shop', q{SELECT status FROM idem.idem_keys WHERE key = 'k1'}),
	'stuck', 'the record stays stuck');
$node->safe_psql('shop', q{
SELECT idem.idem_set_reconciler('pay-su', NULL);
DROP TRIGGER escalate ON idem.idem_keys;
});

# 5. A reconciler of a role the owner is a member of, in a schema of its own
$node->safe_psql('shop', q{
CREATE SCHEMA pay AUTHORIZATION payments;
GRANT USAGE ON SCHEMA idem TO payments;
GRANT EXECUTE ON FUNCTION idem.idem_set_reconciler(text, regprocedure),
	idem.idem_complete(text, text, jsonb, integer, text, text) TO payments;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idem_reconcilers TO payments;
SET ROLE payments;
CREATE FUNCTION pay.reconcile(r idem.idem_keys) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM idem.idem_complete(r.operation, r.key, '{"by": "payments"}', 200, NULL, r.scope);
END $$;
SELECT idem.idem_set_reconciler('pay', 'pay.reconcile(idem.idem_keys)');
});
$node->safe_psql('shop', q{GRANT SELECT, UPDATE ON idem.idem_keys TO payments},
	extra_params => [ '-U', 'keys_owner' ]);

# ... without USAGE on its schema the worker cannot resolve it
$offset = -s $node->logfile;
$node->safe_psql('shop', q{SELECT idem.idem_reserve('pay', 'k2')});
ok( $node->wait_for_log(
		qr/WARNING:  reconciler pay\.reconcile\(idem\.idem_keys\) failed for idempotency key "k2"\n.*DETAIL:  .*permission denied for schema pay/,
		$offset),
	'worker: without USAGE on the reconciler\'s schema, the owner of idem_keys cannot call it');
is($node->safe_psql('shop', q{SELECT status FROM idem.idem_keys WHERE key = 'k2'}),
	'stuck', 'and the record stays stuck');

# ... with it, the worker completes the record, sweeps and flags as that owner
$offset = -s $node->logfile;
$node->safe_psql('shop', q{GRANT USAGE ON SCHEMA pay TO keys_owner});
ok( defined wait_for($node, 'shop',
		q{SELECT response->>'by' = 'payments' FROM idem.idem_keys WHERE key = 'k2'}, 30),
	'worker: with the documented grants it runs the reconciler of a role the owner can act as');
$node->safe_psql('shop', q{
SELECT idem.idem_reserve('swept', 'k3', ttl => '1 millisecond');
SELECT idem.idem_complete('swept', 'k3', '{}');
});
ok( defined wait_for($node, 'shop',
		q{SELECT count(*) = 0 FROM idem.idem_keys WHERE key = 'k3'}, 30),
	'and sweeps the table it owns');
is(log_errors($node, offset => $offset), '', 'with no error in the log');
is($node->safe_psql('shop', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'keys_owner'}),
	'f', 'the owner of idem_keys is still not a superuser');

$node->stop('fast');
unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no server process crashed');

done_testing();
