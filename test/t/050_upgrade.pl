# Upgrading from release 0.2.0 is no outage, and ALTER EXTENSION
# idempotency UPDATE keeps every record with its meaning and every
# reconciler, and leaves the same catalog as a fresh install of the current
# version.
#
# The new library (installed, and preloaded from the start as after the
# restart a package upgrade needs) serves the 0.2.0 catalog unchanged until
# the update: every function and the background worker work on it, and a
# storm of concurrent clients (test/scripts/storm.sh's) sees no error and
# runs no effect twice, before the update, while it runs, and after it.
#
# The records are written as release 0.2.0 wrote them, column for column,
# into the table its install script (idempotency--0.2.0.sql, kept as
# released) created: 0.2.0's library is not installed next to this one.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
# The worker stays off but where the test says: it calls the maintenance
# itself
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.enabled = off
idempotency.processing_timeout = '1h'
idempotency.sweep_interval = '100ms'
max_connections = 40
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});
$node->start;

my $current = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});

$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', q{CREATE EXTENSION idempotency VERSION '0.2.0'});
is($node->safe_psql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.2.0', 'the extension was created at 0.2.0');

# Release 0.2.0's records: one of each status, as idem_reserve,
# idem_checkpoint and idem_complete of 0.2.0 left them (the processing and
# the stuck one without a ttl, as reserved at 0.1.0 and kept by the update
# to 0.2.0); a reconciler registered by hand (the handler's signature, run
# as its registrant); and the effects table it guards.
$node->safe_psql('old', q{
CREATE TABLE charges (key text PRIMARY KEY, amount int NOT NULL);
INSERT INTO charges VALUES ('k-stuck', 30);

CREATE FUNCTION reconcile_charge(r idem_keys) RETURNS void
LANGUAGE plpgsql SET search_path = public AS $$
BEGIN
	IF EXISTS (SELECT FROM charges WHERE key = r.key) THEN
		PERFORM idem_complete(r.operation, r.key,
			jsonb_build_object('charged', r.key, 'by', 'reconciler'), 201, r.key, r.scope);
	END IF;
END $$;

INSERT INTO idem_keys (scope, operation, key, request_hash, status,
	response_status, response, resource_id, recovery_point,
	created_at, updated_at, expires_at, ttl)
VALUES
	('', 'pay', 'k-done', idem_hash('{"amount": 10}'), 'completed',
	 201, '{"id": 1, "status": "paid"}', 'r-1', NULL,
	 now() - interval '5 min', now() - interval '5 min', now() + interval '1 day', interval '1 day'),
	('', 'pay', 'k-open', idem_hash('{"amount": 20}'), 'processing',
	 NULL, NULL, NULL, 'charge-sent',
	 now() - interval '1 min', now() - interval '1 min', now() + interval '1 day', NULL),
	('', 'pay', 'k-stuck', idem_hash('{"amount": 30}'), 'stuck',
	 NULL, NULL, NULL, 'charge-sent',
	 now() - interval '2 hours', now() - interval '2 hours', now() + interval '1 day', NULL),
	('acct-2', 'pay', 'k-done', idem_hash('{"amount": 10}'), 'completed',
	 402, '{"error": "declined"}', NULL, NULL,
	 now() - interval '5 min', now() - interval '5 min', now() + interval '1 day', interval '1 day');

INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('pay', 'public.reconcile_charge(public.idem_keys)', current_user::regrole);

CREATE FUNCTION served_echo(request jsonb) RETURNS jsonb
LANGUAGE sql SET search_path = public AS 'SELECT request';
});

# A storm: pgbench clients at READ COMMITTED and REPEATABLE READ reserve
# 200 keys of their own operation (storm-RUN), insert an effect for each
# new one and complete it, or roll back (test/scripts/lib/storm.pgbench).
# storm_start returns the clients, to finish with storm_finish: none may
# fail, and every completed key has exactly one effect.
my $storm_script = 'test/scripts/lib/storm.pgbench';
$node->safe_psql('old', 'CREATE TABLE storm_effects (op text NOT NULL, k int NOT NULL)');

sub storm_start
{
	my ($run, $transactions) = @_;
	my @runs;
	foreach my $iso ('read committed', 'repeatable read')
	{
		my ($out, $err) = ('', '');
		(my $value = $iso) =~ s/ /\\ /g;
		local $ENV{PGOPTIONS} = "-c default_transaction_isolation=$value";
		my $h = IPC::Run::start(
			[ 'pgbench', '-n', '-c', '4', '-j', '2', '-t', $transactions,
			  '--max-tries=1000', '-D', "op=storm-$run", '-D', 'keys=200', '-f', $storm_script,
			  '-h', $node->host, '-p', $node->port, 'old' ],
			'>', \$out, '2>', \$err);
		push @runs, [ $iso, $h, \$out, \$err ];
	}
	return \@runs;
}

sub storm_finish
{
	my ($run, $runs, $when) = @_;
	my $op = "storm-$run";
	foreach my $r (@$runs)
	{
		my ($iso, $h, $out, $err) = @$r;
		my $ok = $h->finish;
		ok($ok && $$out !~ /number of failed transactions: [1-9]/ && $$err !~ /ERROR|aborted/,
			"$when: the $iso clients saw no error")
		  or diag("stdout:\n$$out\nstderr:\n$$err");
	}
	# Which of the 200 keys got a committed attempt is up to pgbench's random
	# choice (a few of them may get none): every key charged is charged
	# once, and is completed, and the storm charged most of them
	my ($charged, $twice, $orphans, $unsettled) = split / /, $node->safe_psql('old', qq{
		SELECT (SELECT count(*) FROM storm_effects WHERE op = '$op') || ' '
			|| (SELECT count(*) FROM (SELECT k FROM storm_effects WHERE op = '$op'
				GROUP BY k HAVING count(*) > 1) d) || ' '
			|| (SELECT count(*) FROM storm_effects e WHERE op = '$op' AND NOT EXISTS
				(SELECT FROM idem_keys i WHERE i.operation = '$op' AND i.key = 'key-' || e.k
					AND i.status = 'completed')) || ' '
			|| (SELECT count(*) FROM idem_keys i WHERE operation = '$op' AND
				(status <> 'completed' OR NOT EXISTS (SELECT FROM storm_effects e
					WHERE e.op = '$op' AND i.key = 'key-' || e.k)))});
	is("$twice $orphans $unsettled", '0 0 0',
		"$when: no key was charged twice, every charge is completed, every record has its charge");
	cmp_ok($charged, '>=', 150, "$when: the storm charged most of the 200 keys ($charged)");
}

# The records written at 0.2.0 keep their meaning; $stuck is a call that
# must answer stuck now
sub check_meaning
{
	my ($when, $stuck, $stuck_answer) = @_;
	is($node->safe_psql('old', q{
		SELECT outcome || ' ' || http_status || ' ' || response::text || ' ' || resource_id
		FROM idem_reserve('pay', 'k-done', '{"amount": 10}')}),
		'replay 201 {"id": 1, "status": "paid"} r-1',
		"$when, a completed key replays the same response");
	is($node->safe_psql('old', q{
		SELECT outcome || ' ' || http_status || ' ' || response::text
		FROM idem_reserve('pay', 'k-done', '{"amount": 10}', scope => 'acct-2')}),
		'replay 402 {"error": "declined"}',
		"$when, so does its namesake in another scope, with its own response");
	is($node->safe_psql('old', q{
		SELECT outcome FROM idem_reserve('pay', 'k-done', '{"amount": 11}')}),
		'mismatch', "$when, a different request for it is a mismatch");
	is($node->safe_psql('old', q{
		SELECT outcome || ' ' || http_status FROM idem_reserve('pay', 'k-open', '{"amount": 20}')}),
		'in_progress 409', "$when, a processing key answers in_progress");
	is($node->safe_psql('old', $stuck), $stuck_answer, "$when, a stuck key is stuck");
}

# The current library serves the 0.2.0 catalog: every record keeps its
# meaning, every function of 0.2.0 works
check_meaning('at 0.2.0',
	q{SELECT outcome || ' ' || recovery_point FROM idem_reserve('pay', 'k-stuck', '{"amount": 30}')},
	'stuck charge-sent');
is($node->safe_psql('old', q{
	BEGIN;
	SELECT outcome FROM idem_reserve('served', 'k1', '{"n": 1}', ttl => '2 hours');
	SELECT idem_checkpoint('served', 'k1', 'half');
	SELECT idem_complete('served', 'k1', '{"n": 1}', 201, 'r-k1');
	COMMIT;
	SELECT outcome || ' ' || response::text FROM idem_reserve('served', 'k1', '{"n": 1}');
	SELECT round(extract(epoch FROM expires_at - updated_at)) FROM idem_lookup('served', 'k1');
	SELECT idem_release('served', 'nothing');
	SELECT idem_consume('served-consumer', 'm1') || ' ' || idem_consume('served-consumer', 'm1');
	SELECT idem_call('served', 'c1', '{"n": 2}', 'served_echo(jsonb)');
	SELECT idem_sweep() || ' ' || idem_flag_stuck();
	CALL idem_maintain();
	SELECT count(*) FROM idem_stats WHERE operation = 'served';
	SELECT idem_canonical('{"b": 1, "a": 2}');}),
	"new\n\n\nreplay {\"n\": 1}\n7200\nf\ntrue false\n{\"n\": 2}\n0 0\n1\n{\"a\":2,\"b\":1}",
	'at 0.2.0, reserve, checkpoint, complete (ttl from completion), release, consume, call, sweep, flag, maintain, statistics and canonical form work');

# A storm against the 0.2.0 catalog
storm_finish(1, storm_start(1, 300), 'at 0.2.0');

# The background worker serves the 0.2.0 catalog: it sweeps an expired
# record, flags an overdue processing one stuck and calls the reconciler
# registered at 0.2.0 for the stuck one
$node->safe_psql('old', q{
INSERT INTO idem_keys (scope, operation, key, request_hash, status,
	response_status, response, created_at, updated_at, expires_at)
VALUES
	('', 'late', 'k-expired', NULL, 'completed', 200, '{}',
	 now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'),
	('', 'late', 'k-late', NULL, 'processing', NULL, NULL,
	 now() - interval '2 hours', now() - interval '2 hours', now() + interval '1 day');
});
$node->append_conf('postgresql.conf', 'idempotency.enabled = on');
$node->reload;
ok($node->poll_query_until('old', q{
	SELECT NOT EXISTS (SELECT FROM idem_keys WHERE key = 'k-expired')
		AND EXISTS (SELECT FROM idem_keys WHERE key = 'k-late' AND status = 'stuck')
		AND EXISTS (SELECT FROM idem_keys WHERE scope = '' AND key = 'k-stuck' AND status = 'completed')}),
	'at 0.2.0, the worker sweeps, flags and reconciles');
$node->append_conf('postgresql.conf', 'idempotency.enabled = off');
$node->reload;
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text
	FROM idem_reserve('pay', 'k-stuck', '{"amount": 30}')}),
	'replay 201 {"by": "reconciler", "charged": "k-stuck"}',
	'what the 0.2.0 reconciler stored replays');
is($node->safe_psql('old', 'SELECT count(*) FROM charges'), '1', 'with one charge, as before');
unlike(slurp_file($node->logfile),
	qr/ERROR:  (?!could not serialize)|terminated by signal|server process .* was terminated/,
	'at 0.2.0, no error in the server log (but the storm\'s retried serialization failures) and no backend crashed');

# The update changes no table: a transaction that holds idem_keys does not
# make it wait
my $holder = $node->background_psql('old');
$holder->query_safe('BEGIN; SELECT count(*) FROM idem_keys;');
# The update, while a storm runs: the storm waits for the update's
# catalog changes at most, and goes on against the new catalog
my $during = storm_start(2, 300);
$node->safe_psql('old', q{SET lock_timeout = '5s'; ALTER EXTENSION idempotency UPDATE});
$holder->query_safe('COMMIT');
$holder->quit;
is($node->safe_psql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$current, "updated to $current while the storm ran");
storm_finish(2, $during, 'during the update');
storm_finish(3, storm_start(3, 300), "at $current");
$node->safe_psql('old', 'SELECT idem_stats_reset()');

# Every record keeps its meaning
check_meaning("at $current", q{SELECT outcome FROM idem_reserve('late', 'k-late')}, 'stuck');
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text
	FROM idem_reserve('pay', 'k-stuck', '{"amount": 30}')}),
	'replay 201 {"by": "reconciler", "charged": "k-stuck"}',
	'the reconciled key still replays');

# The reconciler registered at 0.2.0 still runs
$node->safe_psql('old', q{
	INSERT INTO charges VALUES ('k-open', 20);
	UPDATE idem_keys SET status = 'stuck' WHERE scope = '' AND key = 'k-open';});
is($node->safe_psql('old', 'SELECT idem_reconcile()'), '1', 'the 0.2.0 reconciler is called');
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text
	FROM idem_reserve('pay', 'k-open', '{"amount": 20}')}),
	'replay 201 {"by": "reconciler", "charged": "k-open"}',
	'and what it stored replays');

# Records reserved at 0.1.0 expire their ttl after completion, as new ones
# do: their ttl stays NULL, and the library counts the one they were
# reserved with (expires_at - created_at)
is($node->safe_psql('old', q{
	SELECT string_agg(key || ' ' || coalesce(ttl::text, 'null') || ', expires '
		|| round(extract(epoch FROM expires_at - updated_at) / 60) || ' min later', '; ' ORDER BY key)
	FROM idem_keys WHERE scope = '' AND key IN ('k-open', 'k-stuck')}),
	'k-open null, expires 1441 min later; k-stuck null, expires 1560 min later',
	'a processing and a stuck record without a ttl expire their ttl after completion');

# New keys work, and the statistics count every call since the reset
is($node->safe_psql('old', q{
	BEGIN;
	SELECT outcome FROM idem_reserve('pay', 'k-new', '{"amount": 40}');
	SELECT idem_complete('pay', 'k-new', '{"id": 4}', 201);
	COMMIT;
	SELECT outcome FROM idem_reserve('pay', 'k-new', '{"amount": 40}');}),
	"new\n\nreplay", 'a new key is reserved, completed and replayed');
is($node->safe_psql('old', q{
	SELECT reserves || ' ' || "new" || ' ' || replays || ' ' || in_progress || ' '
		|| mismatches || ' ' || stuck || ' ' || completes
	FROM idem_stats WHERE operation = 'pay'}),
	'8 1 5 1 1 0 2', 'the statistics count the calls made since the update');

# The updated catalog is the one a fresh install creates: every object of
# the extension, every column, constraint, index, trigger, view, routine,
# type, grant, comment and config dump
my $catalog = q{
WITH ext AS (
	SELECT oid, extconfig, extcondition FROM pg_extension WHERE extname = 'idempotency'),
members AS (
	SELECT d.classid, d.objid, d.objsubid
	FROM pg_depend d, ext
	WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
		AND d.deptype = 'e'),
rels AS (
	SELECT m.objid AS oid FROM members m WHERE m.classid = 'pg_class'::regclass
	UNION
	SELECT t.typrelid FROM pg_type t JOIN members m
		ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
	WHERE t.typrelid <> 0
	UNION
	SELECT i.indexrelid FROM pg_index i JOIN members m
		ON m.classid = 'pg_class'::regclass AND m.objid = i.indrelid),
lines AS (
	SELECT 'member ' || pg_describe_object(classid, objid, objsubid) AS line
	FROM members
	UNION ALL
	SELECT format('relation %s kind %s owner %s options %s acl %s comment %s',
		c.oid::regclass, c.relkind, c.relowner::regrole, c.reloptions,
		(SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(c.relacl) a),
		obj_description(c.oid, 'pg_class'))
	FROM pg_class c JOIN rels USING (oid)
	UNION ALL
	SELECT format('column %s.%s %s not null %s default %s collation %s identity %s generated %s acl %s comment %s',
		a.attrelid::regclass, a.attname, format_type(a.atttypid, a.atttypmod),
		a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid), co.collname,
		a.attidentity, a.attgenerated,
		(SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(a.attacl) x),
		col_description(a.attrelid, a.attnum))
	FROM pg_attribute a JOIN rels r ON r.oid = a.attrelid
	LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
	LEFT JOIN pg_collation co ON co.oid = a.attcollation
	WHERE a.attnum > 0 AND NOT a.attisdropped
	UNION ALL
	SELECT format('constraint %s on %s: %s', con.conname, con.conrelid::regclass,
		pg_get_constraintdef(con.oid))
	FROM pg_constraint con JOIN rels r ON r.oid = con.conrelid
	UNION ALL
	SELECT 'index ' || pg_get_indexdef(i.indexrelid)
	FROM pg_index i JOIN rels r ON r.oid = i.indrelid
	UNION ALL
	SELECT 'trigger ' || pg_get_triggerdef(t.oid)
	FROM pg_trigger t JOIN rels r ON r.oid = t.tgrelid WHERE NOT t.tgisinternal
	UNION ALL
	SELECT format('policy %s on %s for %s to %s using %s check %s', p.polname,
		p.polrelid::regclass, p.polcmd, p.polroles::regrole[],
		pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid))
	FROM pg_policy p JOIN rels r ON r.oid = p.polrelid
	UNION ALL
	SELECT format('view %s: %s', c.oid::regclass, pg_get_viewdef(c.oid, true))
	FROM pg_class c JOIN rels USING (oid) WHERE c.relkind IN ('v', 'm')
	UNION ALL
	SELECT format('routine %s owner %s acl %s comment %s: %s', p.oid::regprocedure,
		p.proowner::regrole,
		(SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(p.proacl) a),
		obj_description(p.oid, 'pg_proc'), pg_get_functiondef(p.oid))
	FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
	UNION ALL
	SELECT format('type %s kind %s owner %s acl %s comment %s', t.oid::regtype,
		t.typtype, t.typowner::regrole,
		(SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(t.typacl) a),
		obj_description(t.oid, 'pg_type'))
	FROM pg_type t JOIN members m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
	UNION ALL
	SELECT format('config dump %s where %s', u.rel::regclass, u.cond)
	FROM ext, unnest(ext.extconfig, ext.extcondition) AS u(rel, cond))
SELECT line FROM lines ORDER BY line COLLATE "C";
};
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
my @updated = split /\n/, $node->safe_psql('old', $catalog);
my @fresh = split /\n/, $node->safe_psql('fresh', $catalog);
my %in_updated = map { $_ => 1 } @updated;
my %in_fresh = map { $_ => 1 } @fresh;
my @only_fresh = grep { !$in_updated{$_} } @fresh;
my @only_updated = grep { !$in_fresh{$_} } @updated;
diag("only in a fresh install: $_") foreach @only_fresh;
diag("only in the updated database: $_") foreach @only_updated;
cmp_ok(scalar(@fresh), '>', 50, 'the catalog listing covers the extension\'s objects');
is(scalar(@only_fresh) + scalar(@only_updated), 0,
	'the updated catalog is the same as a fresh install of ' . $current);

done_testing();
