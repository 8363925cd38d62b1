# Crashes and restarts: an uncommitted reservation vanishes with its
# transaction; a committed processing record survives and becomes stuck.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\nrestart_after_crash = on");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE payments (key text, amount int);
});

# 1. kill -9 the backend between reserve and COMMIT
my $s = $node->background_psql('postgres', on_error_stop => 0);
is($s->query_safe(q{BEGIN; SELECT outcome FROM idem_reserve('pay', 'k1', '{"amount": 10}');}),
	'new', 'reserved inside an open transaction');
$s->query_safe(q{INSERT INTO payments VALUES ('k1', 10);});
my $pid = $s->query_safe('SELECT pg_backend_pid()');
is($node->safe_psql('postgres',
		q{SELECT outcome FROM idem_reserve('pay', 'k1', '{"amount": 10}')}),
	'in_progress', 'another session sees in_progress while it is open');

kill 'KILL', $pid;
$s->{run}->kill_kill;
# the postmaster restarts after a backend is killed by a signal
$node->poll_query_until('postgres', 'SELECT 1', '1')
  or die 'server did not come back after crash';
like(slurp_file($node->logfile), qr/terminated by signal 9/, 'the backend crashed');

is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('pay', 'k1')}),
	'0', 'after the crash the key is absent');
is($node->safe_psql('postgres', q{SELECT count(*) FROM payments}),
	'0', 'and so is the effect');
is($node->safe_psql('postgres',
		q{SELECT outcome FROM idem_reserve('pay', 'k1', '{"amount": 10}')}),
	'new', 'a retry is new');

# 2. a committed processing record survives an immediate shutdown (crash)
$node->safe_psql('postgres',
	q{SELECT outcome FROM idem_reserve('gateway', 'g1', '{"amount": 20}')});
$node->safe_psql('postgres',
	q{SELECT idem_checkpoint('gateway', 'g1', 'charge-sent')});
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres',
		q{SELECT status || ' ' || recovery_point FROM idem_lookup('gateway', 'g1')}),
	'processing charge-sent', 'committed processing record survived the crash');
is($node->safe_psql('postgres',
		q{SELECT outcome FROM idem_reserve('gateway', 'g1', '{"amount": 20}')}),
	'in_progress', 'young: in_progress');
sleep(1);
is($node->safe_psql('postgres', q{
	SET idempotency.processing_timeout = '500ms';
	SELECT outcome || ' ' || http_status || ' ' || recovery_point
	FROM idem_reserve('gateway', 'g1', '{"amount": 20}')}),
	'stuck 409 charge-sent', 'older than processing_timeout: stuck, with its recovery point');

# 3. a completed record survives the crash and replays
$node->safe_psql('postgres', q{SELECT idem_complete('gateway', 'g1', '{"id": "ch_1"}', 201, 'ch_1')});
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text
	FROM idem_reserve('gateway', 'g1', '{"amount": 20}')}),
	'replay 201 {"id": "ch_1"}', 'completed record replays after the crash');

$node->stop;
done_testing();
