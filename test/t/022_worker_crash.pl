# Crashes during a sweep: kill -9 of the worker, then of the postmaster,
# while it deletes a large backlog of expired records.  Each batch is its
# own transaction, so after recovery every record is either gone whole or
# still there unchanged, no live record is lost or touched, and the worker
# comes back and finishes the sweep.  Last, the worker yields to a busy
# client session.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node);
use Time::HiRes qw(time usleep);

my $backlog = 300_000;

my $node = start_node('crash', q{
log_line_prefix = '%m [%p] %b '
idempotency.sweep_interval = '500ms'
idempotency.sweep_batch_size = 500
idempotency.processing_timeout = '1h'
idempotency.enabled = off
restart_after_crash = on
});
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# A backlog of expired completed records, and live ones of every kind;
# snap keeps a copy of everything to compare with after each crash
sub fill
{
	$node->safe_psql(
		'postgres', qq{
TRUNCATE idem_keys;
INSERT INTO idem_keys (scope, operation, key, request_hash, status,
	response_status, response, created_at, updated_at, expires_at)
SELECT 'bulk', 'pay', 'x' || i, '\\x01'::bytea, 'completed', 200,
	jsonb_build_object('i', i), now() - interval '2 days', now() - interval '2 days',
	now() - interval '1 day' + i * interval '1 ms'
FROM generate_series(1, $backlog) i;
INSERT INTO idem_keys (scope, operation, key, status, response_status, response,
	expires_at)
SELECT 'live', 'pay', 'c' || i, 'completed', 201, jsonb_build_object('c', i),
	now() + interval '1 day'
FROM generate_series(1, 1000) i;
INSERT INTO idem_keys (scope, operation, key, status, expires_at, recovery_point)
SELECT 'live', 'pay', 'p' || i, CASE WHEN i % 2 = 0 THEN 'stuck' ELSE 'processing' END,
	now() - interval '1 day', 'step-' || i
FROM generate_series(1, 100) i;
DROP TABLE IF EXISTS snap;
CREATE TABLE snap AS SELECT * FROM idem_keys;
});
}

# What must hold after a crash: nothing changed or new, no live record lost
my $check = q{
SELECT (SELECT count(*) FROM (SELECT * FROM idem_keys EXCEPT ALL SELECT * FROM snap) changed)
	|| ' ' ||
	(SELECT count(*) FROM (SELECT * FROM snap WHERE scope = 'live'
		EXCEPT ALL SELECT * FROM idem_keys) lost)
	|| ' ' ||
	(SELECT count(*) FROM idem_keys WHERE scope = 'bulk')};

# Enable the worker and wait until it is deleting, part-way; its pid
sub start_sweep
{
	$node->safe_psql('postgres',
		q{ALTER SYSTEM SET idempotency.enabled = on; SELECT pg_reload_conf()});
	my $t0 = time;
	while (time - $t0 < 60)
	{
		my $row = $node->safe_psql(
			'postgres', q{
SELECT (SELECT count(*) FROM idem_keys WHERE scope = 'bulk') || ' ' ||
	coalesce((SELECT pid FROM pg_stat_activity
			  WHERE backend_type = 'idempotency worker' AND datname = 'postgres'), 0)});
		my ($left, $pid) = split / /, $row;
		return ($left, $pid) if $left < $backlog * 0.9 && $left > $backlog * 0.2 && $pid;
		usleep(20_000);
	}
	return (undef, undef);
}

# After the crash: wait for recovery, then check and let the sweep finish
sub after_crash
{
	my ($what) = @_;

	# Not poll_query_until: while the server restarts, psql may exit before
	# it has read its query, and writing it then dies with EPIPE
	my ($back, $t0) = (0, time);
	while (!$back && time - $t0 < 180)
	{
		$back = eval { $node->safe_psql('postgres', 'SELECT 1') eq '1' };
		usleep(100_000) unless $back;
	}
	ok($back, "$what: the server is back");
	my ($changed, $lost, $left) = split / /, $node->safe_psql('postgres', $check);
	is($changed, '0', "$what: every remaining record is unchanged");
	is($lost, '0', "$what: no live record is lost");
	diag("$what: $left expired records left after recovery");
	ok( $node->poll_query_until(
			'postgres', q{SELECT count(*) = 0 FROM idem_keys WHERE scope = 'bulk'}),
		"$what: the worker comes back and finishes the sweep");
	is( $node->safe_psql(
			'postgres', q{
SELECT count(*) FROM (SELECT * FROM snap WHERE scope = 'live'
	EXCEPT ALL SELECT * FROM idem_keys) lost}),
		'0', "$what: still no live record lost");
	$node->safe_psql('postgres',
		q{ALTER SYSTEM SET idempotency.enabled = off; SELECT pg_reload_conf()});
}

# kill -9 of the worker: the postmaster restarts everything
fill();
my ($left, $pid) = start_sweep();
ok(defined $pid, "the worker is sweeping (pid " . ($pid // '?') . ", $left left)");
kill 'KILL', $pid if $pid;
after_crash('kill -9 of the worker');

# kill -9 of the postmaster: the worker notices between batches and exits;
# then the server is started again and recovers
fill();
($left, $pid) = start_sweep();
ok(defined $pid, "the worker is sweeping again ($left left)");
$node->kill9;
my $t0 = time;
while (kill(0, $pid) && time - $t0 < 30)
{
	usleep(50_000);
}
ok(!kill(0, $pid), 'the orphaned worker exits when the postmaster is gone');
# Other orphans may hold shared memory a little longer
my $started = 0;
for (1 .. 60)
{
	last if ($started = $node->start(fail_ok => 1));
	sleep(1);
}
ok($started, 'the server starts again after the postmaster was killed');
after_crash('kill -9 of the postmaster');

# While a client session is busy the worker pauses between batches (the
# Extension wait event), yielding to it; the sweep still finishes
fill();
my $busy = $node->background_psql('postgres');
$busy->query_until(qr/busy/, "\\echo busy\nSELECT pg_sleep(6);\n");
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.enabled = on; SELECT pg_reload_conf()});
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity
WHERE backend_type = 'idempotency worker' AND wait_event_type = 'Extension'}),
	'with a busy client session the worker pauses between batches');
$busy->quit;
ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) = 0 FROM idem_keys WHERE scope = 'bulk'}),
	'and finishes the sweep');

$node->stop;
done_testing();
