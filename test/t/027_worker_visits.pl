# The launcher visits only the databases that have the extension, and
# learns which without connecting to each every interval: a database whose
# visit found no extension gets no worker again until something says it may
# have one.  CREATE EXTENSION gets the database maintained at once, CREATE
# DATABASE from a template that has the extension at the next round; a
# CREATE EXTENSION rolled back and a DROP EXTENSION leave the database
# unvisited; a restart visits every database once again.  Worker starts are
# counted in the launcher's DEBUG1 lines.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node log_errors);
use Time::HiRes qw(time usleep);

my $node = start_node('visits', q{
log_min_messages = debug1
idempotency.sweep_interval = '200ms'
max_prepared_transactions = 2
});

my @plain = ('plain1', 'plain2', 'plain3');
$node->safe_psql('postgres', "CREATE DATABASE $_") for (@plain, 'served');
$node->safe_psql('served', 'CREATE EXTENSION idempotency');

# Workers the launcher started for a database, in the log from offset on
sub starts
{
	my ($db, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my @lines = ($log =~ /idempotency launcher started a worker for database "\Q$db\E"/g);
	return scalar @lines;
}

# Poll a query in database served until it returns 't'; seconds, or undef
sub wait_for
{
	my ($sql, $timeout) = @_;
	my $t0 = time;
	while (time - $t0 < $timeout)
	{
		my ($rc, $out) = $node->psql('served', $sql);
		return time - $t0 if $rc == 0 && $out eq 't';
		usleep(50_000);
	}
	return undef;
}

sub maintained
{
	my ($db) = @_;
	return qq{SELECT count(*) > 0 FROM idem_worker_status WHERE datname = '$db' AND passes > 0};
}

# Fifteen rounds once each database has been visited once
ok(defined wait_for(maintained('served'), 10), 'the database with the extension is maintained');
sleep(1);
my $offset = -s $node->logfile;
sleep(3);
cmp_ok(starts('served', $offset), '>=', 5,
	'the database with the extension gets a worker every round ('
	  . starts('served', $offset) . ' in 3 s)');
for my $db (@plain, 'postgres')
{
	is(starts($db, $offset), 0, "$db, without the extension, gets no worker again");
}

# CREATE EXTENSION: maintained at once, without waiting for a round
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.sweep_interval = '1h'});
$node->reload;
sleep(1);
$offset = -s $node->logfile;
$node->safe_psql('plain1', 'CREATE EXTENSION idempotency');
my $took = wait_for(maintained('plain1'), 10);
ok(defined $took && $took < 5,
	'CREATE EXTENSION gets the database maintained at once ('
	  . ($took // 'never') . ' s, with an interval of one hour)');

# A CREATE EXTENSION rolled back, whole or to a savepoint, hints nothing
$offset = -s $node->logfile;
$node->safe_psql('plain2', q{
BEGIN;
CREATE EXTENSION idempotency;
ROLLBACK;
BEGIN;
SAVEPOINT s;
CREATE EXTENSION idempotency;
ROLLBACK TO SAVEPOINT s;
COMMIT;
});
# Another extension in a database without ours hints nothing either
$node->safe_psql('plain3', 'CREATE EXTENSION citext');
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.sweep_interval = '200ms'});
$node->reload;
sleep(3);
is(starts('plain2', $offset), 0, 'a CREATE EXTENSION rolled back brings no worker');
is(starts('plain3', $offset), 0, 'CREATE EXTENSION of another extension brings no worker');
cmp_ok(starts('plain1', $offset), '>=', 5, 'plain1 now gets a worker every round');

# A prepared transaction hints at PREPARE, for good, since its COMMIT
# PREPARED runs no callback of ours: the database is maintained once it
# commits
$node->safe_psql('plain3', q{
BEGIN;
CREATE EXTENSION idempotency;
PREPARE TRANSACTION 'create_idem';
});
sleep(1);
$node->safe_psql('plain3', q{COMMIT PREPARED 'create_idem'});
ok(defined wait_for(maintained('plain3'), 10),
	'CREATE EXTENSION committed with COMMIT PREPARED gets the database maintained');

# CREATE DATABASE from a template that has the extension: a new database,
# visited at the next round.  The worker pauses, so that nobody is
# connected to the template.
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.enabled = off');
$node->reload;
sleep(1);
$node->safe_psql('postgres', 'CREATE DATABASE copied TEMPLATE plain1');
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.enabled = on');
$node->reload;
ok(defined wait_for(maintained('copied'), 10),
	'a database created from a template with the extension is maintained');

# DROP EXTENSION: the next visit finds it gone, and there is none after
$node->safe_psql('plain1', 'DROP EXTENSION idempotency');
sleep(1);
$offset = -s $node->logfile;
sleep(2);
is(starts('plain1', $offset), 0, 'after DROP EXTENSION the database gets no worker');

# A restart of the server forgets what the launcher knew: every database
# is visited once, then only those with the extension
$offset = -s $node->logfile;
$node->restart;
ok(defined wait_for(maintained('served'), 10), 'maintained after the restart');
sleep(3);
is(starts('plain2', $offset), 1, 'after the restart, plain2 gets one worker and no more');
cmp_ok(starts('copied', $offset), '>=', 5, 'copied gets a worker every round');

# (the restart may stop a worker that is connecting, with a FATAL)
is(log_errors($node, warnings => 1), '', 'no errors in the log');

$node->stop;
done_testing();
