# ALTER EXTENSION idempotency UPDATE runs no code of another role.  The
# update runs as a superuser (the extension is not trusted); a role that
# owns idem_keys (the README supports another owner) or holds TRIGGER on
# idem_reconcilers gives them statement triggers that note who fired them
# and try to make that role SUPERUSER.  A statement trigger fires for any
# DML on its table, even one that changes no row, so the update must write
# no row: none of them fires, and what the 0.1.0 -> 0.2.0 script wrote
# before (the ttl of open records, the registrar of reconcilers) the
# library now computes (test/scripts/script_rules.sh checks the scripts
# for DML; test/t/050_upgrade.pl that the records keep their meaning).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade_role_code');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.enabled = off
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql(
	'shop', q{
CREATE EXTENSION idempotency VERSION '0.1.0';
-- a record of 0.1.0 reserved for 7 days and still open, and a reconciler
-- registered at 0.1.0
INSERT INTO idem_keys (scope, operation, key, status, created_at, updated_at, expires_at)
VALUES ('', 'pay', 'k-open', 'processing', now() - interval '1 min',
	now() - interval '1 min', now() - interval '1 min' + interval '7 days');
CREATE FUNCTION reconcile_pay(r idem_keys) RETURNS void LANGUAGE sql AS $$ SELECT $$;
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('pay', 'public.reconcile_pay(public.idem_keys)', current_user::regrole);

-- an application role's grants on the functions whose result type the
-- update changes (DROP FUNCTION, CREATE FUNCTION)
CREATE ROLE app;
GRANT SELECT, INSERT, UPDATE ON idem_keys TO app;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_lookup(text, text, text) TO app;

CREATE ROLE tabowner;
ALTER TABLE idem_keys OWNER TO tabowner;
GRANT TRIGGER ON idem_reconcilers TO tabowner;
CREATE SCHEMA tabowner AUTHORIZATION tabowner;
SET ROLE tabowner;
CREATE TABLE tabowner.fired (tbl text, event text, who name);
GRANT INSERT ON tabowner.fired TO PUBLIC;
CREATE FUNCTION tabowner.note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO tabowner.fired VALUES (TG_TABLE_NAME, TG_WHEN || ' ' || TG_OP, current_user);
	BEGIN
		ALTER ROLE tabowner SUPERUSER;
	EXCEPTION WHEN insufficient_privilege THEN
		NULL;
	END;
	RETURN NULL;
END $$;
CREATE TRIGGER note_before BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.idem_keys
	FOR EACH STATEMENT EXECUTE FUNCTION tabowner.note();
CREATE TRIGGER note_after AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.idem_keys
	FOR EACH STATEMENT EXECUTE FUNCTION tabowner.note();
CREATE TRIGGER note_before BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.idem_reconcilers
	FOR EACH STATEMENT EXECUTE FUNCTION tabowner.note();
CREATE TRIGGER note_after AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.idem_reconcilers
	FOR EACH STATEMENT EXECUTE FUNCTION tabowner.note();
});

# The triggers do fire for a statement that changes no row (shown with
# the owner's own one, which cannot make it SUPERUSER)
$node->safe_psql('shop', q{SET ROLE tabowner; UPDATE idem_keys SET key = key WHERE false});
is($node->safe_psql('shop', q{SELECT count(*) FROM tabowner.fired}),
	'2', 'an UPDATE of no row fires the statement triggers of idem_keys');
$node->safe_psql('shop', q{TRUNCATE tabowner.fired});

# A view that uses idem_lookup would stop DROP FUNCTION with a hint to
# CASCADE: the update refuses first, naming it, and changes nothing
$node->safe_psql('shop', q{CREATE VIEW public.open_keys AS SELECT * FROM idem_lookup('pay', 'k-open')});
my ($rc, $out, $err) = $node->psql('shop', 'ALTER EXTENSION idempotency UPDATE');
like($err,
	qr/ERROR:  cannot update extension "idempotency": view open_keys uses idem_reserve or idem_lookup\n.*\nHINT:  Drop those objects, run ALTER EXTENSION idempotency UPDATE, and create them again\./,
	'a view that uses idem_lookup: the update refuses, naming it, with a hint that loses nothing');
$node->safe_psql('shop', q{DROP VIEW public.open_keys});

$node->safe_psql('shop', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('shop', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.3.0', 'the extension was updated');
is( $node->safe_psql(
		'shop',
		q{SELECT coalesce(string_agg(tbl || ' ' || event || ' as ' || who, ', '), 'none') FROM tabowner.fired}),
	'none', 'the update fired no trigger of idem_keys\' owner nor of idem_reconcilers');
is($node->safe_psql('shop', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'tabowner'}),
	'f', 'the owner of idem_keys did not become SUPERUSER');

$node->safe_psql('shop', q{
DROP TRIGGER note_before ON idem_keys; DROP TRIGGER note_after ON idem_keys;
DROP TRIGGER note_before ON idem_reconcilers; DROP TRIGGER note_after ON idem_reconcilers;
});

# What the script no longer writes, the library computes: the open record
# completes with the ttl it was reserved with, and the reconciler of 0.1.0
# keeps running as the role that registered it
$node->safe_psql('shop', q{SELECT idem_complete('pay', 'k-open', '{}')});
is( $node->safe_psql(
		'shop',
		q{SELECT round(extract(epoch FROM expires_at - updated_at) / 3600) FROM idem_keys WHERE key = 'k-open'}),
	'168', 'a record of 0.1.0 reserved for 7 days expires 7 days after its completion');
is($node->safe_psql('shop', q{SELECT registered_by::oid FROM idem_reconcilers}),
	'0', 'the reconciler of 0.1.0 was left as it was (registrar 0)');
# (a superuser's reconciler runs only while a superuser owns idem_keys:
# doc/security.md, Reconcilers by construction)
$node->safe_psql('shop', q{
ALTER TABLE idem_keys OWNER TO CURRENT_USER;
SELECT idem_reserve('pay', 'k-stuck');
UPDATE idem_keys SET status = 'stuck' WHERE key = 'k-stuck';
});
is($node->safe_psql('shop', q{SELECT idem_reconcile()}), '1',
	'and it is called, as run_as');

# idem_reserve and idem_lookup declare their columns (no relation is opened
# for their result); the application keeps its grants and its queries
is( $node->safe_psql(
		'shop', q{
SELECT string_agg(proname || ' ' || prorettype::regtype || ' ' || (proallargtypes IS NOT NULL), ', ' ORDER BY proname)
FROM pg_proc WHERE proname IN ('idem_reserve', 'idem_lookup')}),
	'idem_lookup record true, idem_reserve record true',
	'idem_reserve and idem_lookup return records of declared columns');
is( $node->safe_psql(
		'shop', q{
SET ROLE app;
SELECT outcome FROM idem_reserve('pay', 'k-app');
SELECT (idem_reserve('pay', 'k-app')).outcome;
SELECT key || ' ' || status || ' ' || (ttl IS NOT NULL) FROM idem_lookup('pay', 'k-app');
SELECT count(*) FROM idem_lookup('pay', 'k-open');}),
	"new
in_progress
k-app processing true
1",
	'the application role keeps EXECUTE on them, with the same columns');

$node->stop('fast');
done_testing();
