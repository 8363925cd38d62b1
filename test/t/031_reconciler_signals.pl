# No reconciler holds its worker (issue 29, items 3 and 4).
# - A reconciler that catches query_canceled in a loop: after
#   idempotency.reconciler_timeout and a short grace the worker process is
#   ended (the launcher starts others), with a WARNING naming the key, and
#   the record stays stuck.  With max_workers = 1, its database and another
#   are maintained again within two timeouts of the call's start.
# - A worker inside a reconciler that sleeps for ten minutes (its database
#   sets reconciler_timeout to an hour) takes signals as PostgreSQL's own
#   processes do: pg_terminate_backend and DROP DATABASE ... WITH (FORCE)
#   end it within a second or two; plain DROP DATABASE and ALTER DATABASE
#   ... RENAME succeed within PostgreSQL's own 5 s; a fast shutdown does
#   not wait for it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node wait_for);
use Time::HiRes qw(time usleep);

my $timeout_s = 3;
my $timed_out;
my $node = start_node('reconciler_signals', qq{
idempotency.sweep_interval = '200ms'
idempotency.processing_timeout = '100ms'
idempotency.reconciler_timeout = '${timeout_s}s'
idempotency.max_workers = 1
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});

# A database with the extension, a reconciler for operation $op whose body
# is $body, and a record of $op that becomes stuck at once
sub shop
{
	my ($db, $body, $settings) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql('postgres', "ALTER DATABASE $db SET $settings") if $settings;
	$node->safe_psql($db, qq{
CREATE EXTENSION idempotency;
CREATE FUNCTION public.reconcile(r idem_keys) RETURNS void LANGUAGE plpgsql AS \$\$
BEGIN
$body
END \$\$;
SELECT idem_set_reconciler('pay', 'public.reconcile(idem_keys)');
});
	return;
}

# The pid of the worker of $db once it is inside the reconciler's sleep
sub worker_in_reconciler
{
	my ($db) = @_;
	my $sql = qq{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency worker'
		AND datname = '$db' AND wait_event = 'PgSleep'};
	my $t0 = time;
	while (time - $t0 < 60)
	{
		my $pid = $node->safe_psql('postgres', $sql);
		return $pid if $pid ne '';
		usleep(50_000);
	}
	return undef;
}

# Seconds until process $pid is gone, or undef after $limit seconds
sub gone_after
{
	my ($pid, $t0, $limit) = @_;
	while (time - $t0 < $limit)
	{
		return time - $t0 unless kill 0, $pid;
		usleep(20_000);
	}
	return undef;
}

# An expired completed record in $db, for the sweep to delete
sub expired
{
	my ($db) = @_;
	$node->safe_psql($db, q{
SELECT idem_reserve('swept', 'e1', ttl => '1 millisecond');
SELECT idem_complete('swept', 'e1', '{}');
});
	return;
}

#
# 3. A time limit that cannot be caught
#
shop('stubborn', q{
	LOOP
		BEGIN
			PERFORM pg_sleep(600);
		EXCEPTION WHEN query_canceled THEN
			NULL;
		END;
	END LOOP;});
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', 'CREATE EXTENSION idempotency');
my $offset = -s $node->logfile;
my $t_reserve = time;
$node->safe_psql('stubborn', q{SELECT idem_reserve('pay', 'k1')});
my $pid = worker_in_reconciler('stubborn');
ok(defined $pid, 'the worker calls the reconciler that catches its cancel');
# Its call started after the reservation; both databases get a record to sweep
expired('stubborn');
expired('other');
my $swept_stubborn;
my $swept_other;
while (time - $t_reserve < 4 * $timeout_s)
{
	$swept_stubborn //= time - $t_reserve
	  if $node->safe_psql('stubborn', q{SELECT count(*) FROM idem_keys WHERE key = 'e1'}) eq '0';
	$swept_other //= time - $t_reserve
	  if $node->safe_psql('other', q{SELECT count(*) FROM idem_keys WHERE key = 'e1'}) eq '0';
	last if defined $swept_stubborn && defined $swept_other;
	usleep(50_000);
}
ok(defined $swept_other && $swept_other < 2 * $timeout_s,
	sprintf('another database is maintained again within two timeouts (%.1f s)', $swept_other // -1));
ok(defined $swept_stubborn && $swept_stubborn < 2 * $timeout_s,
	sprintf('and so is the reconciler\'s own (%.1f s)', $swept_stubborn // -1));
ok(!kill(0, $pid), 'the worker that ran the reconciler has ended');
like(slurp_file($node->logfile, $offset),
	qr/WARNING:  reconciler public\.reconcile\(public\.idem_keys\) did not end at its time limit for idempotency key "k1"/,
	'with a WARNING naming the key');
is($node->safe_psql('stubborn', q{SELECT status FROM idem_keys WHERE key = 'k1'}),
	'stuck', 'the record stays stuck');
$node->safe_psql('stubborn', q{SELECT idem_set_reconciler('pay', NULL)});
$node->safe_psql('postgres', q{
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'stubborn';
});

#
# 4. Signals, for a reconciler in a ten-minute sleep under an hour's limit
#
my $sleeper = q{	PERFORM pg_sleep(600);};
my $hour = q{idempotency.reconciler_timeout = '1h'};

# pg_terminate_backend
shop('term', $sleeper, $hour);
$node->safe_psql('term', q{SELECT idem_reserve('pay', 'k1')});
$pid = worker_in_reconciler('term');
ok(defined $pid, 'the worker sleeps in the reconciler');
my $t0 = time;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
my $took = gone_after($pid, $t0, 10);
ok(defined $took && $took < 1, sprintf('pg_terminate_backend ends a worker inside a reconciler within a second (%.2f s)', $took // -1));

# DROP DATABASE ... WITH (FORCE): the worker is back in the reconciler
$pid = worker_in_reconciler('term');
ok(defined $pid, 'a new worker sleeps in the reconciler again');
$t0 = time;
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE term WITH (FORCE)',
	timeout => 60, timed_out => \$timed_out);
$took = time - $t0;
ok(!$timed_out && $rc == 0,
	'DROP DATABASE ... WITH (FORCE) of a database whose worker is in a reconciler succeeds');
ok($took < 2, sprintf('within a second or two (%.2f s)', $took));

# plain DROP DATABASE
shop('plain', $sleeper, $hour);
$node->safe_psql('plain', q{SELECT idem_reserve('pay', 'k1')});
$pid = worker_in_reconciler('plain');
ok(defined $pid, 'the worker sleeps in the reconciler of the next database');
$t0 = time;
($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE plain',
	timeout => 60, timed_out => \$timed_out);
$took = time - $t0;
ok(!$timed_out && $rc == 0, 'plain DROP DATABASE succeeds while the worker is in a reconciler')
  or diag($err);
ok($took < 5, sprintf('within PostgreSQL\'s own 5 s (%.2f s)', $took));

# ALTER DATABASE ... RENAME
shop('renamed', $sleeper, $hour);
$node->safe_psql('renamed', q{SELECT idem_reserve('pay', 'k1')});
$pid = worker_in_reconciler('renamed');
ok(defined $pid, 'the worker sleeps in the reconciler of the database to rename');
$t0 = time;
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE renamed RENAME TO renamed2',
	timeout => 60, timed_out => \$timed_out);
$took = time - $t0;
ok(!$timed_out && $rc == 0, 'ALTER DATABASE ... RENAME succeeds while the worker is in a reconciler')
  or diag($err);
ok($took < 5, sprintf('within 5 s (%.2f s)', $took));

# shutdown: the worker is back in the renamed database's reconciler
$pid = worker_in_reconciler('renamed2');
ok(defined $pid, 'the worker calls the reconciler in the renamed database');
$t0 = time;
$node->stop('fast');
$took = time - $t0;
ok($took < 5, sprintf('a fast shutdown does not wait for a worker inside a reconciler (%.2f s)', $took));
unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no server process crashed');

done_testing();
