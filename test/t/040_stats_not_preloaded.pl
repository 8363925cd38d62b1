# Without shared_preload_libraries the statistics and the worker's status
# cannot exist: idem_stats, idem_stats_reset() and idem_worker_status raise
# an error that says how to enable them, and every other function of the
# extension works unchanged.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('not_preloaded');
$node->init;
$node->start;

is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'', 'the cluster does not preload anything');
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# Reading the statistics: a clear error, its SQLSTATE, and the hint
my ($rc, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT * FROM idem_stats");
isnt($rc, 0, 'selecting idem_stats fails');
like($err, qr/ERROR:  55000: idempotency statistics are not enabled/,
	'the error says the statistics are not enabled, SQLSTATE 55000');
like($err,
	qr/HINT:  Add "idempotency" to "shared_preload_libraries" in postgresql.conf and restart the server\./,
	'the hint names shared_preload_libraries');

($rc, $out, $err) = $node->psql('postgres', 'SELECT idem_stats_reset()');
isnt($rc, 0, 'idem_stats_reset() fails');
like($err, qr/idempotency statistics are not enabled/,
	'idem_stats_reset() gives the same error');

# The worker's status lives in shared memory too: the same kind of error
($rc, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT * FROM idem_worker_status");
isnt($rc, 0, 'selecting idem_worker_status fails');
like($err, qr/ERROR:  55000: idempotency worker status is not available/,
	'the error says the worker status is not available, SQLSTATE 55000');
like($err,
	qr/HINT:  Add "idempotency" to "shared_preload_libraries" in postgresql.conf and restart the server\./,
	'its hint names shared_preload_libraries');

# Everything else works, in one session and across sessions
is( $node->safe_psql(
		'postgres', q{
BEGIN;
SELECT outcome FROM idem_reserve('pay', 'k1', '{"amount": 1}');
SELECT idem_complete('pay', 'k1', '{"id": 1}', 201, 'r1');
COMMIT;
SELECT outcome || ' ' || http_status FROM idem_reserve('pay', 'k1', '{"amount": 1}');
SELECT outcome FROM idem_reserve('pay', 'k1', '{"amount": 2}');
SELECT status || ' ' || resource_id FROM idem_lookup('pay', 'k1');
SELECT outcome FROM idem_reserve('pay', 'k2');
SELECT idem_checkpoint('pay', 'k2', 'step-1');
SELECT recovery_point FROM idem_lookup('pay', 'k2');
SELECT idem_release('pay', 'k2');
SELECT count(*) FROM idem_lookup('pay', 'k2');
}),
	"new\n\nreplay 201\nmismatch\ncompleted r1\nnew\n\nstep-1\nt\n0",
	'reserve, complete, replay, mismatch, lookup, checkpoint and release work');

is( $node->safe_psql(
		'postgres',
		q{SELECT outcome FROM idem_reserve('pay', 'k1', '{"amount": 1}')}),
	'replay', 'a new session replays the completed key');

# idempotency.track_stats exists and can be set, with no effect
is( $node->safe_psql(
		'postgres', q{
SET idempotency.track_stats = off;
SELECT outcome FROM idem_reserve('pay', 'k3');
SHOW idempotency.track_stats;
}),
	"new\noff",
	'idempotency.track_stats can be set');

$node->stop;
done_testing();
