# ALTER EXTENSION idempotency UPDATE from release 0.1.0 keeps every record
# with its meaning and every reconciler, and leaves the same catalog as a
# fresh install of the current version.  Before the update, the current
# library against the 0.1.0 catalog answers with a clean ERROR whose hint is
# ALTER EXTENSION idempotency UPDATE, never a crash.
#
# The records are written as release 0.1.0 wrote them, column for column,
# into the table its install script (idempotency--0.1.0.sql, kept as
# released) created: this library cannot write them itself, since it refuses
# the older table, and 0.1.0's library is not installed next to it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
# The worker stays off: the test calls the maintenance itself
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.enabled = off
idempotency.processing_timeout = '1h'
});
$node->start;

my $current = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});

$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', q{CREATE EXTENSION idempotency VERSION '0.1.0'});
is($node->safe_psql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.1.0', 'the extension was created at 0.1.0');

# Release 0.1.0's records: one of each status, as idem_reserve,
# idem_checkpoint and idem_complete of 0.1.0 left them; a reconciler
# registered as 0.1.0's idem_set_reconciler stored it (the handler's
# signature, run as its registrant); and the effects table it guards.
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
	created_at, updated_at, expires_at)
VALUES
	('', 'pay', 'k-done', idem_hash('{"amount": 10}'), 'completed',
	 201, '{"id": 1, "status": "paid"}', 'r-1', NULL,
	 now() - interval '5 min', now() - interval '5 min', now() + interval '1 day'),
	('', 'pay', 'k-open', idem_hash('{"amount": 20}'), 'processing',
	 NULL, NULL, NULL, 'charge-sent',
	 now() - interval '1 min', now() - interval '1 min', now() + interval '1 day'),
	('', 'pay', 'k-stuck', idem_hash('{"amount": 30}'), 'stuck',
	 NULL, NULL, NULL, 'charge-sent',
	 now() - interval '2 hours', now() - interval '2 hours', now() + interval '1 day'),
	('acct-2', 'pay', 'k-done', idem_hash('{"amount": 10}'), 'completed',
	 402, '{"error": "declined"}', NULL, NULL,
	 now() - interval '5 min', now() - interval '5 min', now() + interval '1 day');

INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('pay', 'public.reconcile_charge(public.idem_keys)', current_user::regrole);
});

# The current library against the 0.1.0 catalog: every function that reads
# or writes the records refuses cleanly and says how to update
my @calls = (
	q{SELECT * FROM idem_reserve('pay', 'k-done', '{"amount": 10}')},
	q{SELECT * FROM idem_reserve('pay', 'k-new', '{"amount": 40}')},
	q{SELECT idem_complete('pay', 'k-open', '{"id": 2}', 201)},
	q{SELECT idem_checkpoint('pay', 'k-open', 'again')},
	q{SELECT idem_release('pay', 'k-open')},
	q{SELECT * FROM idem_lookup('pay', 'k-done')},
	q{SELECT idem_sweep()},
	q{SELECT idem_flag_stuck()},
	q{SELECT idem_reconcile()},
	q{CALL idem_maintain()});
foreach my $sql (@calls)
{
	my ($rc, $out, $err) = $node->psql('old', "\\set VERBOSITY verbose\n$sql");
	isnt($rc, 0, "at 0.1.0, $sql fails");
	like($err, qr/ERROR:  55000: .*\n(?:.*\n)*HINT:  .*ALTER EXTENSION idempotency UPDATE/,
		"and its hint is ALTER EXTENSION idempotency UPDATE");
}

# Whatever else the old catalog calls (the statistics, the canonical form)
# either works or fails cleanly: the server never goes down
foreach my $sql (q{SELECT count(*) FROM idem_stats}, q{SELECT idem_stats_reset()},
	q{SELECT idem_canonical('{"b": 1, "a": 2}')}, q{SELECT count(*) FROM idem_stuck})
{
	$node->psql('old', $sql);
}
# So does the background worker's pass over the 0.1.0 catalog
my $offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "idempotency.enabled = on\nidempotency.sweep_interval = '100ms'");
$node->reload;
$node->wait_for_log(qr/HINT:  Run ALTER EXTENSION idempotency UPDATE/, $offset);
pass('the worker\'s pass over the 0.1.0 catalog fails with the same hint');
$node->append_conf('postgresql.conf', 'idempotency.enabled = off');
$node->reload;

is($node->safe_psql('old', 'SELECT 1'), '1', 'the server is up after every call against 0.1.0');
unlike(slurp_file($node->logfile), qr/terminated by signal|server process .* was terminated/,
	'no backend crashed');
is($node->safe_psql('old', 'SELECT count(*) FROM idem_keys'), '4',
	'and no record changed: four');

# The update
$node->safe_psql('old', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$current, "updated to $current");
$node->safe_psql('old', 'SELECT idem_stats_reset()');

# Every record keeps its meaning
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text || ' ' || resource_id
	FROM idem_reserve('pay', 'k-done', '{"amount": 10}')}),
	'replay 201 {"id": 1, "status": "paid"} r-1',
	'a completed key replays the same response');
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text
	FROM idem_reserve('pay', 'k-done', '{"amount": 10}', scope => 'acct-2')}),
	'replay 402 {"error": "declined"}',
	'and so does its namesake in another scope, with its own response');
is($node->safe_psql('old', q{
	SELECT outcome FROM idem_reserve('pay', 'k-done', '{"amount": 11}')}),
	'mismatch', 'a different request for it is a mismatch');
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || http_status FROM idem_reserve('pay', 'k-open', '{"amount": 20}')}),
	'in_progress 409', 'a processing key answers in_progress');
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || recovery_point FROM idem_reserve('pay', 'k-stuck', '{"amount": 30}')}),
	'stuck charge-sent', 'a stuck key is still stuck, with its recovery point');

# The reconciler registered at 0.1.0 still runs, and settles the stuck key
is($node->safe_psql('old', 'SELECT idem_reconcile()'), '1', 'the 0.1.0 reconciler is called');
is($node->safe_psql('old', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text
	FROM idem_reserve('pay', 'k-stuck', '{"amount": 30}')}),
	'replay 201 {"by": "reconciler", "charged": "k-stuck"}',
	'and what it stored replays');
is($node->safe_psql('old', 'SELECT count(*) FROM charges'), '1', 'with one charge, as before');

# Records reserved at 0.1.0 expire their ttl after completion, as new ones
# do: the library counts the ttl they were reserved with (expires_at -
# created_at; the update writes no row, so their ttl column stays NULL)
$node->safe_psql('old', q{SELECT idem_complete('pay', 'k-open', '{"id": 2}', 201)});
is($node->safe_psql('old', q{
	SELECT string_agg(key || ' ' || coalesce(ttl::text, 'no ttl') || ', expires '
		|| round(extract(epoch FROM expires_at - updated_at) / 60) || ' min later', '; ' ORDER BY key)
	FROM idem_keys WHERE scope = '' AND key IN ('k-open', 'k-stuck')}),
	'k-open no ttl, expires 1441 min later; k-stuck no ttl, expires 1560 min later',
	'a processing and a stuck record of 0.1.0 expire their ttl after completion');

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
	'8 1 4 1 1 1 3', 'the statistics count the calls made since the update');

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
