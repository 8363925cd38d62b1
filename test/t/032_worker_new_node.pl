# A database created and given the extension by a prepared transaction
# right after start-up, as Citus does on a node it adds (citus_add_node) or
# propagates CREATE EXTENSION to: CREATE DATABASE, then CREATE EXTENSION
# committed with two-phase commit, before the launcher's next round.  The
# hint of the PREPARE brings a visit at once, which finds no extension yet
# (the transaction is only prepared); the database must still be served
# within two sweep intervals of COMMIT PREPARED, and every round after.
# (Before the fix the launcher dropped the hint of a database it had not
# listed yet, so that first visit marked it absent for good: worker2's
# database in test/scripts/citus.sh was never maintained.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node wait_for log_errors);
use Time::HiRes qw(time usleep);

my $interval = 5;
my $node = start_node('new_node', qq{
log_min_messages = debug1
idempotency.sweep_interval = '${interval}s'
max_prepared_transactions = 2
});

# A database with the extension, to read the launcher's next round
$node->safe_psql('postgres', 'CREATE DATABASE served');
$node->safe_psql('served', 'CREATE EXTENSION idempotency');
my $next_round = q{SELECT next_pass_due FROM idem_worker_status WHERE datname = 'served'};
ok(defined wait_for($node, 'served', "SELECT ($next_round) IS NOT NULL", 3 * $interval),
	'the launcher reports its next round');

# Right after a round, so that the launcher lists the new database first
# when the PREPARE's hint comes, not at a round before it
my $round = $node->safe_psql('served', $next_round);
my $t0 = time;
usleep(20_000) while $node->safe_psql('served', $next_round) eq $round
  && time - $t0 < 3 * $interval;
$round = $node->safe_psql('served', $next_round);
my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', q{
BEGIN;
CREATE EXTENSION idempotency;
SELECT idem_reserve('pay', 'x' || i, ttl => '1 hour'), idem_complete('pay', 'x' || i)
FROM generate_series(1, 50) i;
UPDATE idem_keys SET expires_at = now() - interval '1 minute';
PREPARE TRANSACTION 'add_node';
});
is($node->safe_psql('served', $next_round), $round,
	'no round of the launcher between CREATE DATABASE and PREPARE');

# The visit the hint brings, before COMMIT PREPARED: no extension to find
# (the postmaster's DEBUG1 line once that worker has exited)
my $visited;
$t0 = time;
while (time - $t0 < 3 * $interval)
{
	my $log = slurp_file($node->logfile, $offset);
	if ($log =~ /unregistering background worker "idempotency worker for database fresh"/)
	{
		$visited = 1;
		last;
	}
	usleep(50_000);
}
ok($visited, 'the PREPARE brought a visit before COMMIT PREPARED');
is($node->safe_psql('served', $next_round), $round,
	'... at once, not at the next round');

$node->safe_psql('fresh', q{COMMIT PREPARED 'add_node'});
my $took = wait_for($node, 'fresh',
	q{SELECT count(*) = 0 FROM idem_keys WHERE expires_at < now()}, 2 * $interval);
ok(defined $took,
	'after COMMIT PREPARED the worker sweeps the database within two sweep intervals ('
	  . (defined $took ? sprintf('%.1f s', $took) : 'never') . ", interval ${interval} s)");
ok( defined wait_for(
		$node, 'fresh',
		q{SELECT passes > 0 FROM idem_worker_status WHERE datname = 'fresh'}, 1),
	'its passes are in idem_worker_status');

# And every round after: a record that expires now is swept too
$node->safe_psql('fresh', q{
SELECT idem_reserve('pay', 'later', ttl => '1 hour'), idem_complete('pay', 'later');
UPDATE idem_keys SET expires_at = now() - interval '1 minute';
});
ok( defined wait_for(
		$node, 'fresh', q{SELECT count(*) = 0 FROM idem_keys}, 2 * $interval),
	'and at the rounds after');

is(log_errors($node, warnings => 1), '', 'no errors in the log');
$node->stop;
done_testing();
