# The worker never stalls (issue 23), with idempotency.max_workers = 1 so
# that a worker held in one database would starve every other one:
# - an application's LOCK TABLE idem_keys IN SHARE MODE in an open, idle
#   transaction: the worker skips that database's batches at once, says so
#   in idem_worker_status (skipped) and in its pass summary, serves the
#   other database meanwhile, and does the work once the lock is gone;
# - a BEFORE UPDATE trigger of the owner that raises for one record: that
#   record is a WARNING naming its key (write_errors), the others are
#   flagged, and the worker does not exit with an error;
# - a reconciler that sleeps for an hour: idempotency.reconciler_timeout
#   (1s here) cancels it with a WARNING, the other database is still
#   served, and ALTER DATABASE RENAME and DROP DATABASE of its database
#   finish within seconds.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest;
use Time::HiRes qw(time usleep);

my $node = start_node('never_stalls', q{
log_line_prefix = '%m [%p] %b '
idempotency.sweep_interval = '500ms'
idempotency.processing_timeout = '200ms'
idempotency.max_workers = 1
idempotency.reconciler_timeout = '1s'
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});

# Expired completed records in a database; the query that is true once
# the worker has swept them
sub expire_some
{
	my ($db, $op) = @_;
	$node->safe_psql(
		$db, qq{
SELECT count(*) FROM (
	SELECT idem_reserve('$op', 'e' || i, ttl => '1 hour'), idem_complete('$op', 'e' || i)
	FROM generate_series(1, 3) i) s;
UPDATE idem_keys SET expires_at = now() - interval '1 minute' WHERE operation = '$op';
});
	return qq{SELECT count(*) = 0 FROM idem_keys WHERE operation = '$op'};
}

for my $db ('held', 'other', 'slow')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
# idem_worker_status is read in a database that has the extension
ok( defined wait_for($node,
		'other', q{SELECT count(*) = 3 FROM idem_worker_status
WHERE datname IN ('held', 'other', 'slow')}, 30),
	'the worker serves the three databases');

# 1. An application role's table lock, held in an idle transaction, with
# the README's application grants
$node->safe_psql(
	'held', q{
CREATE ROLE app LOGIN;
GRANT USAGE ON SCHEMA public TO app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO app;
});
# (taken while the worker is paused, so that it cannot sweep them first)
set_conf($node, 'idempotency.enabled = off');
my $held_swept = expire_some('held', 'lock');
my $app = $node->background_psql('held', extra_params => [ '-U', 'app' ]);
$app->query_safe('BEGIN');
$app->query_safe('LOCK TABLE idem_keys IN SHARE MODE');
set_conf($node, 'idempotency.enabled = on');

ok( defined wait_for($node,
		'other', q{SELECT skipped > 0 AND total_skipped > 0 FROM idem_worker_status
WHERE datname = 'held'}, 15),
	'a pass that finds idem_keys locked skips its batches and says so in idem_worker_status');
my $other_swept = expire_some('other', 'meanwhile');
ok(defined wait_for($node, 'other', $other_swept, 15),
	'the other database is served while the lock is held (max_workers = 1)');
is($node->safe_psql('held', q{SELECT count(*) FROM idem_keys WHERE operation = 'lock'}),
	'3', 'nothing of the locked database was swept');
like(
	slurp_file($node->logfile),
	qr/LOG:  idempotency worker for database held: deleted 0 expired records.* [1-9]\d* skipped, 0 write errors\n.*DETAIL:  Some work was skipped because another transaction held a lock on table "idem_keys"/,
	'the pass summary says what was skipped, and why');
$app->query_safe('COMMIT');
$app->quit;
ok(defined wait_for($node, 'held', $held_swept, 15),
	'once the lock is gone, the next pass does the work');

# 2. One record whose flag a trigger refuses
$node->safe_psql(
	'other', q{
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF OLD.key = 'bad' AND NEW.status = 'stuck' THEN
		RAISE EXCEPTION 'record % is under audit', OLD.key;
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION refuse();
SELECT count(*) FROM (
	SELECT idem_reserve('audit', k) FROM (VALUES ('a'), ('bad'), ('c')) v(k)) s;
});
ok( defined wait_for($node,
		'other', q{SELECT string_agg(key || ':' || status, ',' ORDER BY key) = 'a:stuck,bad:processing,c:stuck'
FROM idem_keys WHERE operation = 'audit'}, 15),
	'a trigger that refuses one record: the others are flagged');
ok( defined wait_for($node,
		'other', q{SELECT write_errors > 0 FROM idem_worker_status WHERE datname = 'other'}, 15),
	'the refused record is counted in idem_worker_status (write_errors)');
my $log = slurp_file($node->logfile);
like(
	$log,
	qr/WARNING:  could not flag idempotency key "bad" as stuck\n.*DETAIL:  Operation "audit", scope "". The write raised: record bad is under audit/,
	'the refused record is a WARNING naming its key');
unlike($log, qr/background worker "idempotency worker" \(PID \d+\) exited with exit code 1/,
	'no worker exited with an error');
$node->safe_psql('other', q{DROP TRIGGER refuse ON idem_keys; DELETE FROM idem_keys WHERE operation = 'audit'});

# 3. A reconciler that never returns
$node->safe_psql(
	'slow', q{
CREATE FUNCTION forever(r idem_keys) RETURNS void LANGUAGE sql AS 'SELECT pg_catalog.pg_sleep(3600)';
SELECT idem_set_reconciler('slow', 'forever(idem_keys)');
SELECT count(*) FROM (SELECT idem_reserve('slow', 'k1')) s;
});
ok( defined wait_for($node,
		'other', q{SELECT total_failed > 0 FROM idem_worker_status WHERE datname = 'slow'}, 20),
	'a reconciler that sleeps for an hour is cancelled after idempotency.reconciler_timeout');
like(
	slurp_file($node->logfile),
	qr/WARNING:  reconciler public\.forever\(public\.idem_keys\) timed out for idempotency key "k1"\n.*DETAIL:  Operation "slow", scope "". The call was cancelled after idempotency.reconciler_timeout \(1000 ms\)/,
	'the timeout is a WARNING naming the key');
$other_swept = expire_some('other', 'still');
ok(defined wait_for($node, 'other', $other_swept, 15),
	'the other database is still served (max_workers = 1)');

# ALTER DATABASE RENAME, then DROP DATABASE, while a worker is, or soon
# will be, inside that reconciler: each waits for one reconciler_timeout
# at most
sub timed_command
{
	my ($sql) = @_;
	my $t0 = time;
	my ($timed_out, $stderr);
	my $rc = $node->psql(
		'postgres', $sql,
		stderr => \$stderr,
		timeout => 60,
		timed_out => \$timed_out);
	diag($stderr) if $rc;
	return ($rc, $timed_out, time - $t0);
}
# The slow reconciler's record is called again after its backoff (10 s,
# then 20 s once its call was ended by the rename), hence the long wait
for my $step ([ 'slow', 'ALTER DATABASE slow RENAME TO slow_renamed' ],
	[ 'slow_renamed', 'DROP DATABASE slow_renamed' ])
{
	my ($db, $sql) = @$step;
	ok( defined wait_for($node,
			'postgres', qq{SELECT count(*) > 0 FROM pg_stat_activity
WHERE backend_type = 'idempotency worker' AND datname = '$db'}, 60),
		"a worker is in database $db, of the slow reconciler");
	my ($rc, $timed_out, $took) = timed_command($sql);
	is($rc, 0, "$sql succeeds");
	ok(!$timed_out && $took < 10,
		"$sql waits at most about one reconciler_timeout (took ${took}s)");
}

$node->stop;
done_testing();
