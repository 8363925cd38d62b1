# The worker's state in shared memory: idem_worker_status shows, for every
# database the worker maintains, what its last pass did and when, the
# totals since start and when the next pass is due; the per-pass summary
# goes to the log at LOG when the pass did something (and
# idempotency.log_pass_min_duration allows it); a dropped extension and a
# dropped database lose their status row, and a dropped database's
# idem_stats entries are reclaimed, so their room serves other databases.
# The view is the same in a database updated from 0.1.0.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IPC::Run;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest;

# The source tree, wherever prove runs from
my $root = "$FindBin::Bin/../..";

my $node = start_node('worker_status', q{
log_line_prefix = '%m [%p] %b '
idempotency.sweep_interval = '1s'
idempotency.processing_timeout = '200ms'
idempotency.stats_max_operations = 10
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});

for my $db ('app', 'gone')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
ok( defined wait_for($node,
		'app', q{SELECT count(*) = 2 AND bool_and(passes > 0)
FROM idem_worker_status WHERE datname IN ('app', 'gone')}, 15),
	'both databases get a status row once the worker has been there');
is($node->safe_psql('app', q{SELECT count(*) FROM idem_worker_status WHERE datname = 'postgres'}),
	'0', 'a database without the extension has none');

# One pass with work of every kind, prepared while the worker is paused so
# that one pass finds it all: 3 expired records, 2 overdue processing ones,
# and reconcilers for them (one completes its key, one raises)
set_conf($node, 'idempotency.enabled = off');
sleep(1);
my $log_from = -s $node->logfile;
$node->safe_psql(
	'app', q{
CREATE FUNCTION settle(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF r.key = 'ok' THEN
		PERFORM public.idem_complete(r.operation, r.key, '{}', 200, NULL, r.scope);
	ELSE
		RAISE EXCEPTION 'gateway unreachable';
	END IF;
END $$;
SELECT idem_set_reconciler('charge', 'settle(idem_keys)');
BEGIN;
SELECT idem_reserve('pay', 'e' || i, ttl => '1 hour'), idem_complete('pay', 'e' || i)
FROM generate_series(1, 3) i;
UPDATE idem_keys SET expires_at = now() - interval '1 minute';
SELECT idem_reserve('charge', k) FROM (VALUES ('ok'), ('boom')) v(k);
COMMIT;
-- after the commit, which writes the reservations above (src/keys.c)
UPDATE idem_keys SET updated_at = now() - interval '1 minute' WHERE operation = 'charge';
});
my $before = $node->safe_psql('app',
	q{SELECT passes FROM idem_worker_status WHERE datname = 'app'});
is( $node->safe_psql(
		'app', q{SELECT next_pass_due IS NULL FROM idem_worker_status WHERE datname = 'app'}),
	't', 'while the worker is paused, no next pass is due');
set_conf($node, 'idempotency.enabled = on');
ok( defined wait_for($node,
		'app', qq{SELECT passes > $before FROM idem_worker_status WHERE datname = 'app'}, 15),
	'the status row shows a new pass');

# The first pass after resuming did everything; the row shows the latest
# pass, and the totals add up what the passes did
my ($deleted, $flagged, $reconciled, $failed) = split /\|/,
  $node->safe_psql('app', q{
SELECT total_deleted, total_flagged, total_reconciled, total_failed
FROM idem_worker_status WHERE datname = 'app'});
is("$deleted $flagged $reconciled", '3 2 1',
	'totals: 3 expired records deleted, 2 flagged, 1 reconciled');
cmp_ok($failed, '>=', 1, "the failed reconciler call is counted ($failed)");
is( $node->safe_psql(
		'app', q{
SELECT (SELECT count(*) FROM idem_keys WHERE operation = 'pay')
	|| ' ' || (SELECT status FROM idem_keys WHERE key = 'ok')
	|| ' ' || (SELECT status FROM idem_keys WHERE key = 'boom')
	|| ' ' || (SELECT expired || ' ' || flagged_stuck FROM idem_stats WHERE operation = 'pay')}),
	'0 completed stuck 3 0',
	'the database agrees: the expired records are gone, one key completed, one stuck');
ok( $node->wait_for_log(
		qr/LOG:  idempotency worker for database app: deleted 3 expired records, flagged 2 stuck, reconciled 1 \(1 failed\) in \d+ ms; \d+ batches, longest [0-9.]+ ms; 0 skipped, 0 write errors\n/,
		$log_from),
	'the pass that did something is logged at LOG with what it did');

is( $node->safe_psql(
		'app', q{
SELECT last_pass_start <= last_pass_end
	AND last_pass_duration = last_pass_end - last_pass_start
	AND last_pass_end BETWEEN now() - interval '5 s' AND now()
	AND next_pass_due BETWEEN last_pass_start AND now() + interval '2 s'
	AND batches >= 2 AND longest_batch > interval '0' AND NOT stopped_early
	AND passes > 1
FROM idem_worker_status WHERE datname = 'app'}),
	't', 'the last pass: when, how long, its batches, and the next pass due within an interval');

# The failing reconciler is called at every pass; release its key, then
# passes do nothing and are not logged at LOG
$node->safe_psql('app', q{SELECT idem_release('charge', 'boom')});
my $p = $node->safe_psql('app', q{SELECT passes FROM idem_worker_status WHERE datname = 'app'});
ok( defined wait_for($node,
		'app', qq{SELECT passes >= $p + 2 AND deleted + flagged + reconciled + failed = 0
FROM idem_worker_status WHERE datname = 'app'}, 15),
	'later passes with nothing to do show zeros for the last pass');
my $log = slurp_file($node->logfile);
unlike($log, qr/LOG:  idempotency worker for database \w+: deleted 0 expired records, flagged 0 stuck, reconciled 0 \(0 failed\)/,
	'a pass that did nothing is not logged at LOG');

# The alert queries of doc/monitoring.md (the ```sql blocks that start
# with "-- alert:"), run as a monitoring role set up as that chapter says
my $monitoring = slurp_file("$root/doc/monitoring.md");
my %alerts = $monitoring =~ /^```sql\n-- alert: ([^\n]+)\n(.*?)^```$/msg;
is(scalar(keys %alerts), 3, 'doc/monitoring.md has three alert queries')
  or diag(join("\n", keys %alerts));
$node->safe_psql(
	'app', q{
CREATE ROLE monitor LOGIN IN ROLE pg_read_all_stats;
GRANT USAGE ON SCHEMA public TO monitor;
});
sub alerts_firing
{
	my @firing;
	for my $name (sort keys %alerts)
	{
		my $rows = $node->safe_psql('app', $alerts{$name},
			extra_params => [ '-U', 'monitor' ]);
		push @firing, "$name: $rows" if $rows ne '';
	}
	return join("\n", @firing);
}
is(alerts_firing(), '', 'healthy: no alert fires');

# The worker paused for more than three intervals, an expired record it
# has not deleted, a record stuck processing: each alert fires
set_conf($node, 'idempotency.enabled = off');
$node->safe_psql(
	'app', q{
SELECT idem_reserve('pay', 'late', ttl => '1 hour'), idem_complete('pay', 'late');
UPDATE idem_keys SET expires_at = now() - interval '1 hour' WHERE key = 'late';
SELECT idem_reserve('pay', 'lost');
UPDATE idem_keys SET updated_at = now() - interval '1 hour' WHERE key = 'lost';
});
sleep(4);
my $firing = alerts_firing();
like($firing, qr/^the sweeper is behind: 1\|/m, 'the sweeper alert fires with the backlog count');
like($firing, qr/^this database has not been maintained for 3 sweep intervals: app\|/m,
	'the maintenance alert fires for the database');
like($firing, qr/^stuck records are waiting for reconciliation: 1\|/m,
	'the stuck alert fires with the count');

# Running again, the worker clears the first two; releasing the key the last
set_conf($node, 'idempotency.enabled = on');
ok( defined wait_for($node,
		'app', q{SELECT count(*) = 0 FROM idem_keys WHERE key = 'late'}, 15),
	'resumed, the worker deletes the expired record');
ok( defined wait_for($node,
		'app', q{SELECT last_pass_end > now() - interval '2 s' FROM idem_worker_status WHERE datname = 'app'}, 15),
	'and maintains the database again');
like(alerts_firing(), qr/\Astuck records are waiting for reconciliation: 1\|[^\n]*\z/,
	'only the stuck alert still fires');
$node->safe_psql('app', q{SELECT idem_release('pay', 'lost')});
is(alerts_firing(), '', 'released, no alert fires');

# The exporter's queries file against the live worker: every query, with
# rows, columns as declared
my ($py_out, $py_err) = (q{}, q{});
IPC::Run::run(
	[
		'python3', "$root/test/scripts/lib/exporter_queries.py",
		"$root/examples/monitoring/queries.yaml",
		'host=' . $node->host . ' port=' . $node->port . ' dbname=app user=monitor',
		'--rows', 'idem_worker', 'idem_stats', 'idem_backlog'
	],
	'>', \$py_out, '2>', \$py_err);
is($? >> 8, 0, 'the postgres_exporter queries run against the live worker')
  or diag("$py_out$py_err");
like($py_out, qr/^ok idem_worker: 15 metrics, [1-9]\d* rows$/m, 'the worker query returns its rows');

# idempotency.log_pass_min_duration = -1: a pass that deletes is not logged
set_conf($node, q{idempotency.log_pass_min_duration = -1});
sleep(1);
$log_from = -s $node->logfile;
my $total = $node->safe_psql('app',
	q{SELECT total_deleted FROM idem_worker_status WHERE datname = 'app'});
$node->safe_psql('app',
	q{SELECT idem_reserve('pay', 'quiet', ttl => '1 ms'), idem_complete('pay', 'quiet')});
ok( defined wait_for($node,
		'app', qq{SELECT total_deleted = $total + 1 FROM idem_worker_status WHERE datname = 'app'}, 15),
	'with log_pass_min_duration = -1 the worker still deletes');
$log = slurp_file($node->logfile, $log_from);
unlike($log, qr/idempotency worker for database app: deleted/,
	'and its pass is not logged at LOG');
set_conf($node, q{idempotency.log_pass_min_duration = 0});

# Readers: pg_read_all_stats, as for idem_stats; nobody else
$node->safe_psql('app', q{CREATE ROLE nobody LOGIN});
my ($rc, $out, $err) = $node->psql('app', 'SELECT * FROM idem_worker_status',
	extra_params => [ '-U', 'nobody' ]);
like($err, qr/permission denied for view idem_worker_status/,
	'a role granted nothing cannot read the view');
is( $node->safe_psql(
		'app', q{SELECT count(*) FROM idem_worker_status WHERE datname = 'app'},
		extra_params => [ '-U', 'monitor' ]),
	'1', 'a member of pg_read_all_stats can');

# Statistics entries of database "gone": 8 operations; with the 2 of "app"
# (pay, charge) all 10 named entries are in use, so a new operation of app
# is counted in its overflow row
$node->safe_psql('gone',
	q{SELECT count(*) FROM generate_series(1, 8) i, LATERAL idem_reserve('g' || i, 'k')});
$node->safe_psql('app', q{SELECT idem_reserve('later1', 'k'), idem_complete('later1', 'k')});
is( $node->safe_psql(
		'app', q{SELECT string_agg(coalesce(operation, '(overflow)'), ',' ORDER BY operation NULLS LAST) FROM idem_stats}),
	'charge,pay,(overflow)', 'with the table full, a new operation of app goes to the overflow row');

# A dropped extension: the database loses its status row at the next visit
$node->safe_psql('gone', 'DROP EXTENSION idempotency');
ok( defined wait_for($node,
		'app', q{SELECT count(*) = 0 FROM idem_worker_status WHERE datname = 'gone'}, 15),
	'after DROP EXTENSION, the database has no status row');
$node->safe_psql('app', q{SELECT idem_reserve('later2', 'k'), idem_complete('later2', 'k')});
is( $node->safe_psql('app', q{SELECT count(*) FROM idem_stats WHERE operation = 'later2'}),
	'0', 'its statistics entries stay while the database exists');

# A dropped database: its status row and its statistics entries go, and
# their room serves the others
$node->safe_psql('gone', 'CREATE EXTENSION idempotency');
ok( defined wait_for($node,
		'app', q{SELECT count(*) = 1 FROM idem_worker_status WHERE datname = 'gone'}, 15),
	'installed again, it has a status row again');
my $gone_oid = $node->safe_psql('postgres', q{SELECT oid FROM pg_database WHERE datname = 'gone'});
$node->safe_psql('postgres', 'DROP DATABASE gone');
ok( defined wait_for($node,
		'app', qq{SELECT count(*) = 0 FROM idem_worker_status WHERE datid = $gone_oid}, 15),
	'a dropped database loses its status row');
$node->safe_psql('app', q{SELECT idem_reserve('later3', 'k'), idem_complete('later3', 'k')});
is( $node->safe_psql(
		'app', q{SELECT string_agg(coalesce(operation, '(overflow)'), ',' ORDER BY operation NULLS LAST) FROM idem_stats}),
	'charge,later3,pay,(overflow)',
	'the statistics room of the dropped database is reused: a new operation gets its own row');
is( $node->safe_psql(
		'app', q{SELECT reserves || ' ' || completes FROM idem_stats WHERE operation IS NULL}),
	'2 2', 'the overflow row keeps what it counted');

# Pausing the worker keeps the rows; only the next pass is no longer due
set_conf($node, 'idempotency.enabled = off');
sleep(1);
is( $node->safe_psql(
		'app', q{SELECT count(*) FILTER (WHERE next_pass_due IS NULL) FROM idem_worker_status WHERE datname = 'app'}),
	'1', 'paused, the row stays and no next pass is due');
set_conf($node, 'idempotency.enabled = on');

# Updated from 0.1.0: the same view, function and grants
$node->safe_psql('postgres', 'CREATE DATABASE old');
# (in one transaction; test/t/050_upgrade.pl has the worker serve the 0.1.0
# catalog in between)
$node->safe_psql('old', q{
BEGIN;
CREATE EXTENSION idempotency VERSION '0.1.0';
ALTER EXTENSION idempotency UPDATE;
COMMIT;
});
my $objects = q{
SELECT pg_get_viewdef('idem_worker_status'::regclass)
	|| (SELECT relacl::text FROM pg_class WHERE oid = 'idem_worker_status'::regclass)
	|| (SELECT proacl::text || pg_get_function_result(oid) FROM pg_proc WHERE proname = 'idem_worker_status')};
is($node->safe_psql('old', $objects), $node->safe_psql('app', $objects),
	'a database updated from 0.1.0 has the same view, function and grants');
ok( defined wait_for($node,
		'old', q{SELECT count(*) = 1 FROM idem_worker_status WHERE datname = 'old'}, 15),
	'and the worker reports there');

$node->stop('fast');
is(log_errors($node, except => [qr/permission denied for view idem_worker_status/]),
	'', 'no other errors in the server log');

done_testing();
