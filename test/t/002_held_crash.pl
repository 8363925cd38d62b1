# Held reservations (src/keys.c: a new key's record written once, at its
# completion or at commit) through crashes and PREPARE TRANSACTION: a record
# written once at completion survives a crash and replays; one written at
# commit survives as processing; a held reservation of an open transaction
# vanishes with it; PREPARE TRANSACTION writes it, and the prepared
# transaction keeps the key through a restart until COMMIT or ROLLBACK
# PREPARED.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('held');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\nrestart_after_crash = on\nmax_prepared_transactions = 4\nidempotency.enabled = off");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE payments (key text, amount int);
});

sub outcome
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT outcome FROM idem_reserve('pay', '$key', '{\"amount\": 10}')");
}

# 1. reserved and completed in one transaction: one insert, and it replays
# after a crash
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_reserve('pay', 'once', '{"amount": 10}');
	INSERT INTO payments VALUES ('once', 10);
	SELECT idem_complete('pay', 'once', '{"id": "p-once"}', 201, 'p-once');
	COMMIT;
});
# a reservation committed without completion, written at commit
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_reserve('pay', 'open', '{"amount": 10}');
	COMMIT;
});
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', q{
	SELECT outcome || ' ' || http_status || ' ' || response::text
	FROM idem_reserve('pay', 'once', '{"amount": 10}')}),
	'replay 201 {"id": "p-once"}', 'a record written once at completion replays after a crash');
is($node->safe_psql('postgres', q{SELECT status FROM idem_keys WHERE key = 'open'}),
	'processing', 'a record written at commit survived the crash');
is(outcome('open'), 'in_progress', 'and answers in_progress');

# 2. a held reservation of an open transaction, the backend killed: gone
my $s = $node->background_psql('postgres', on_error_stop => 0);
is($s->query_safe(q{BEGIN; SELECT outcome FROM idem_reserve('pay', 'held', '{"amount": 10}');}),
	'new', 'held inside an open transaction');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_keys WHERE key = 'held'}),
	'0', 'nothing written while it is held');
is(outcome('held'), 'in_progress', 'another session sees in_progress');
my $pid = $s->query_safe('SELECT pg_backend_pid()');
kill 'KILL', $pid;
$s->{run}->kill_kill;
$node->poll_query_until('postgres', 'SELECT 1', '1')
  or die 'server did not come back after crash';
is(outcome('held'), 'new', 'after the crash the key is new');

# 3. PREPARE TRANSACTION writes the held reservation; the prepared
# transaction keeps the key through a restart
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_reserve('pay', 'p1', '{"amount": 10}');
	INSERT INTO payments VALUES ('p1', 10);
	PREPARE TRANSACTION 'held-1';
	BEGIN;
	SELECT idem_reserve('pay', 'p2', '{"amount": 10}');
	SELECT idem_complete('pay', 'p2', '{"id": "p-2"}', 201, 'p-2');
	PREPARE TRANSACTION 'held-2';
});
is(outcome('p1'), 'in_progress', 'prepared: in_progress');
$node->stop('immediate');
$node->start;
is(outcome('p1'), 'in_progress', 'prepared, after a crash: in_progress');
is(outcome('p2'), 'in_progress', 'prepared completion, after a crash: in_progress');
$node->safe_psql('postgres', q{COMMIT PREPARED 'held-1'});
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'held-2'});
is($node->safe_psql('postgres', q{SELECT status FROM idem_keys WHERE key = 'p1'}),
	'processing', 'COMMIT PREPARED: the processing record written at PREPARE');
is(outcome('p2'), 'new', 'ROLLBACK PREPARED: the key is new again');

$node->stop;
done_testing();
