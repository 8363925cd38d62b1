# Reconcilers that no role can turn against the cluster, where the worker
# or several login roles are needed (the one-session attacks are in
# sql/reconcilers.sql).  The worker runs a superuser's reconciler that
# calls idem_release without a schema: search_path planted through the
# database (by a non-superuser database owner) and through the worker's
# role must not run the attacker's idem_release; nor must a role setting of
# the idem_maint role for idem_reconcile() and CALL idem_maintain().  A
# handler rewritten around the trigger to an internal function, and a
# membership revoked after registration, are skipped with a WARNING.  Each
# checks that the attacker got no SUPERUSER and no row, and that no server
# process crashed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node);
use Time::HiRes qw(time usleep);

my $node = start_node('worker_security', q{
idempotency.sweep_interval = '300ms'
idempotency.processing_timeout = '100ms'
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});

my $super = $node->safe_psql('postgres', 'SELECT rolname FROM pg_roles WHERE oid = 10');

# Poll a query until it returns 't'; true when it did
sub wait_until
{
	my ($db, $sql, $timeout) = @_;
	my $t0 = time;
	while (time - $t0 < $timeout)
	{
		return 1 if $node->safe_psql($db, $sql) eq 't';
		usleep(100_000);
	}
	return 0;
}

# A shop database owned by a role that is not a superuser, with the
# extension, doc/security.md's idem_maint role, and its planted idem_release
$node->safe_psql(
	'postgres', q{
CREATE ROLE dbowner LOGIN;
CREATE ROLE maint LOGIN;
CREATE DATABASE shop OWNER dbowner;
});
$node->safe_psql(
	'shop', q{
-- The extension's schema, on every reconciler's search_path, belongs to
-- the superuser: where the database owner may create in it, a superuser's
-- reconciler is skipped (test/t/029_reconciler_schema.pl)
ALTER SCHEMA public OWNER TO CURRENT_USER;
CREATE EXTENSION idempotency;
GRANT SELECT, UPDATE, DELETE ON idem_keys TO maint;
GRANT SELECT ON idem_reconcilers TO maint;
GRANT EXECUTE ON FUNCTION idem_sweep(integer), idem_flag_stuck(), idem_reconcile() TO maint;
GRANT EXECUTE ON PROCEDURE idem_maintain() TO maint;
CREATE SCHEMA evil AUTHORIZATION maint;
CREATE TABLE calls (key text, who name, path text);
GRANT INSERT ON calls TO PUBLIC;
CREATE FUNCTION release_it(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.calls VALUES (r.key, current_user, current_setting('search_path'));
	PERFORM idem_release(r.operation, r.key, r.scope);
END $$;
SELECT idem_set_reconciler('pay', 'release_it(idem_keys)');
});
$node->safe_psql(
	'shop', q{
SET ROLE maint;
CREATE FUNCTION evil.idem_release(operation text, key text, scope text DEFAULT '')
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE maint SUPERUSER;
	RETURN true;
END $$;
});

my $is_super = q{SELECT rolsuper FROM pg_roles WHERE rolname = 'maint'};

# The worker, with the database's search_path set by its owner
$node->safe_psql('shop', 'ALTER DATABASE shop SET search_path = evil, public',
	extra_params => [ '-U', 'dbowner' ]);
is($node->safe_psql('shop', 'SHOW search_path', extra_params => [ '-U', 'maint' ]),
	'evil, public', 'the database owner planted search_path for every session');
$node->safe_psql('shop', q{SELECT idem_reserve('pay', 'w1')});
ok(wait_until('shop', q{SELECT count(*) = 0 FROM idem_keys WHERE key = 'w1'}, 30),
	'the worker flags the record and its reconciler releases it');
is($node->safe_psql('shop', $is_super), 'f',
	'worker, ALTER DATABASE SET search_path: the planted idem_release did not run');
is($node->safe_psql('shop', q{SELECT who || ' ' || path FROM calls WHERE key = 'w1'}),
	"$super pg_catalog, public, pg_temp",
	'the reconciler ran as its registrar with search_path pinned');

# A trigger on idem_keys that names a function without a schema fires in
# the worker's flagging UPDATE, as the superuser: the planted search_path
# must not choose that function either (the worker's own path is
# pg_catalog, pg_temp, so the careless trigger fails instead: the flag of
# that record is a WARNING naming its key)
$node->safe_psql(
	'shop', q{
CREATE FUNCTION public.audit_note(k text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION public.audit_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM audit_note(NEW.key);
	RETURN NEW;
END $$;
CREATE TRIGGER audit BEFORE UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION public.audit_trigger();
SET ROLE maint;
CREATE FUNCTION evil.audit_note(k text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE maint SUPERUSER;
END $$;
});
my $offset = -s $node->logfile;
$node->safe_psql('shop', q{SELECT idem_reserve('pay', 'w-trigger')});
ok( $node->wait_for_log(
		qr/WARNING:  could not flag idempotency key "w-trigger" as stuck\n.*DETAIL:  .*The write raised: function audit_note\(text\) does not exist/,
		$offset),
	'the worker runs the trigger with its own search_path');
is($node->safe_psql('shop', $is_super), 'f',
	'worker, trigger on idem_keys, ALTER DATABASE SET search_path: the planted function did not run');
$node->safe_psql('shop', q{DROP TRIGGER audit ON idem_keys; DELETE FROM idem_keys});

# A role that owns idem_keys (or holds TRIGGER on it) chooses code that
# runs inside the worker's writes: the worker runs them as that owner, in a
# security-restricted operation, not as the superuser it connects as
$node->safe_psql(
	'shop', q{
CREATE ROLE tabowner;
ALTER TABLE idem_keys OWNER TO tabowner;
GRANT SELECT ON idem_reconcilers TO tabowner;
CREATE SCHEMA tabowner AUTHORIZATION tabowner;
SET ROLE tabowner;
CREATE FUNCTION tabowner.owner_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE tabowner SUPERUSER;
	RETURN NEW;
END $$;
CREATE TRIGGER owner_trigger BEFORE UPDATE ON public.idem_keys
	FOR EACH ROW EXECUTE FUNCTION tabowner.owner_trigger();
});
$offset = -s $node->logfile;
$node->safe_psql('shop', q{SELECT idem_reserve('pay', 'w-owner')});
ok( $node->wait_for_log(
		# the message of 15; 16 and later say "permission denied to alter role"
		qr/DETAIL:  .*The write raised: (must be superuser to alter superuser roles or change superuser attribute|permission denied to alter role)/,
		$offset),
	'the worker runs the trigger of idem_keys\' owner as that owner');
is($node->safe_psql('shop', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'tabowner'}),
	'f', 'worker, trigger added by the owner of idem_keys: it got no SUPERUSER');
$node->safe_psql(
	'shop', q{
DROP TRIGGER owner_trigger ON idem_keys;
ALTER TABLE idem_keys OWNER TO CURRENT_USER;
DELETE FROM idem_keys;
});

# The worker, with its role's search_path set for the database
$node->safe_psql('shop', "ALTER ROLE \"$super\" IN DATABASE shop SET search_path = evil, public");
$node->safe_psql('shop', q{SELECT idem_reserve('pay', 'w2')});
ok(wait_until('shop', q{SELECT count(*) = 0 FROM idem_keys WHERE key = 'w2'}, 30),
	'the worker reconciles again');
is($node->safe_psql('shop', $is_super), 'f',
	'worker, ALTER ROLE ... SET search_path: the planted idem_release did not run');
$node->safe_psql('shop', "ALTER ROLE \"$super\" IN DATABASE shop RESET search_path");
$node->safe_psql('shop', 'ALTER DATABASE shop RESET search_path',
	extra_params => [ '-U', 'dbowner' ]);

# The SQL entry points, called by idem_maint with its own role setting;
# the worker is paused so that it does not reconcile first
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.enabled = off; SELECT pg_reload_conf()});
sleep(1);
$node->safe_psql('shop', 'ALTER ROLE maint SET search_path = evil, public',
	extra_params => [ '-U', 'maint' ]);
$node->safe_psql(
	'shop', q{
SELECT idem_reserve('pay', k) FROM (VALUES ('s1'), ('s2')) v(k);
UPDATE idem_keys SET status = 'stuck' WHERE key IN ('s1', 's2');
});
is($node->safe_psql('shop', 'SELECT idem_reconcile()', extra_params => [ '-U', 'maint' ]),
	'2', 'idem_maint runs idem_reconcile() with its role search_path');
is($node->safe_psql('shop', $is_super), 'f',
	'idem_reconcile(), ALTER ROLE ... SET search_path: the planted idem_release did not run');
$node->safe_psql(
	'shop', q{
SELECT idem_reserve('pay', 's3');
UPDATE idem_keys SET status = 'stuck' WHERE key = 's3';
});
$node->safe_psql('shop', 'CALL idem_maintain()', extra_params => [ '-U', 'maint' ]);
is($node->safe_psql('shop', q{SELECT count(*) FROM idem_keys WHERE key LIKE 's_'}),
	'0', 'CALL idem_maintain() reconciles too');
is($node->safe_psql('shop', $is_super), 'f',
	'CALL idem_maintain(), ALTER ROLE ... SET search_path: the planted idem_release did not run');
is( $node->safe_psql(
		'shop', q{SELECT string_agg(DISTINCT path, ',') FROM calls WHERE key LIKE 's_'}),
	'pg_catalog, public, pg_temp',
	'each call had search_path pinned');
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.enabled = on; SELECT pg_reload_conf()});

# A handler rewritten around the trigger to internal functions: the worker
# skips it with a WARNING, instead of crashing on it
$offset = -s $node->logfile;
$node->safe_psql(
	'shop', q{
SET session_replication_role = replica;
UPDATE idem_reconcilers SET handler = 'pg_catalog.int4recv(internal)';
RESET session_replication_role;
SELECT idem_reserve('pay', 'x1');
});
ok( $node->wait_for_log(
		qr/WARNING:  reconciler pg_catalog\.int4recv\(internal\) of operation "pay" was skipped/,
		$offset),
	'worker: a handler changed to int4recv(internal) is skipped with a WARNING');
$offset = -s $node->logfile;
$node->safe_psql(
	'shop', q{
SET session_replication_role = replica;
UPDATE idem_reconcilers SET handler = 'pg_catalog.array_typanalyze(internal)';
RESET session_replication_role;
});
ok( $node->wait_for_log(
		qr/WARNING:  reconciler pg_catalog\.array_typanalyze\(internal\) of operation "pay" was skipped/,
		$offset),
	'worker: ... and one changed to array_typanalyze(internal)');
# The next pass still runs: the worker did not die on it
$offset = -s $node->logfile;
ok( $node->wait_for_log(
		qr/WARNING:  reconciler pg_catalog\.array_typanalyze\(internal\) of operation "pay" was skipped/,
		$offset),
	'worker: and again at the next pass');
is($node->safe_psql('shop', q{SELECT status FROM idem_keys WHERE key = 'x1'}),
	'stuck', 'the record stays stuck');
$node->safe_psql('shop', q{DELETE FROM idem_keys; SELECT idem_set_reconciler('pay', NULL)});

# A membership revoked after registration
$node->safe_psql(
	'shop', q{
CREATE ROLE payments;
CREATE ROLE member LOGIN IN ROLE payments;
CREATE TABLE secrets (card text);
INSERT INTO secrets VALUES ('4111-1111-1111-1111');
REVOKE ALL ON secrets FROM PUBLIC;
GRANT SELECT ON secrets TO payments;
GRANT SELECT, UPDATE, DELETE ON idem_keys TO payments;
GRANT EXECUTE ON FUNCTION idem_release(text, text, text) TO payments;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_reconcilers TO member;
CREATE SCHEMA member AUTHORIZATION member;
});
$node->safe_psql(
	'shop', q{
CREATE TABLE member.loot (card text);
GRANT USAGE ON SCHEMA member TO PUBLIC;
GRANT INSERT ON member.loot TO PUBLIC;
CREATE FUNCTION member.reconcile(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.calls VALUES (r.key, current_user, NULL);
END $$;
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('pay', 'member.reconcile(public.idem_keys)', 'payments');
}, extra_params => [ '-U', 'member' ]);
$node->safe_psql('shop', q{SELECT idem_reserve('pay', 'm1')});
ok(wait_until('shop', q{SELECT count(*) >= 1 FROM calls WHERE key = 'm1' AND who = 'payments'}, 30),
	'while a member, its reconciler runs as payments');
$node->safe_psql('shop', 'REVOKE payments FROM member');
$node->safe_psql(
	'shop', q{
CREATE OR REPLACE FUNCTION member.reconcile(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO member.loot SELECT card FROM public.secrets;
END $$;
}, extra_params => [ '-U', 'member' ]);
$offset = -s $node->logfile;
ok( $node->wait_for_log(
		qr/WARNING:  reconciler member\.reconcile\(public\.idem_keys\) of operation "pay" was skipped\n.*DETAIL:  Role "member", which registered it, may no longer act as role "payments"/,
		$offset),
	'worker: after the membership is revoked, the reconciler is skipped with a WARNING');
is($node->safe_psql('shop', 'SELECT count(*) FROM member.loot'),
	'0', 'and no secret was copied');

$node->stop('fast');
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal/, 'no server process crashed');
unlike($log, qr/\bPANIC:/, 'no PANIC');
# The passes that failed on the triggers above exited on an ERROR, whose
# abort released the lock on the database already
unlike($log, qr/you don't own a lock/,
	'a worker whose pass failed releases its lock on the database once');

done_testing();
