# A streaming standby runs no worker: keys replicate to it, nothing is
# deleted or flagged there and no idempotency process shows in its
# pg_stat_activity; replays there follow the primary's changes.  Once
# promoted, it starts the launcher and sweeps.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(log_errors);

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# The primary keeps its worker paused, so that the records stay to be seen
$primary->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
log_line_prefix = '%m [%p] %b '
idempotency.sweep_interval = '500ms'
idempotency.processing_timeout = '200ms'
idempotency.enabled = off
});
$primary->start;
$primary->backup('backup');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->append_conf('postgresql.conf', 'idempotency.enabled = on');
$standby->start;

$primary->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
SELECT idem_reserve('pay', 'e' || i, ttl => '1 ms'), idem_complete('pay', 'e' || i)
FROM generate_series(1, 10) i;
SELECT idem_reserve('pay', 'live', ttl => '1 hour'), idem_complete('pay', 'live');
SELECT idem_reserve('pay', 'p' || i) FROM generate_series(1, 3) i;
});
$primary->wait_for_catchup($standby);

my $state = q{
SELECT count(*) FILTER (WHERE status = 'completed' AND expires_at < now()) || ' ' ||
	count(*) FILTER (WHERE status = 'completed' AND expires_at >= now()) || ' ' ||
	count(*) FILTER (WHERE status = 'processing') || ' ' ||
	count(*) FILTER (WHERE status = 'stuck')
FROM idem_keys};
is($standby->safe_psql('postgres', $state), '10 1 3 0', 'the keys are replicated');
sleep(3);    # six sweep intervals
is($standby->safe_psql('postgres', $state),
	'10 1 3 0', 'nothing is deleted or flagged on the standby');
is( $standby->safe_psql(
		'postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}),
	'0', 'no idempotency process runs on the standby');
is($primary->safe_psql('postgres', $state),
	'10 1 3 0', 'the paused primary has not swept either');

# Replays on the standby, a read-only transaction: they read the primary
# key and answer without writing; once the primary changes the record, the
# replay returns its new version
my $replay = q{SELECT outcome || ' ' || coalesce(response::text, '-')
FROM idem_reserve('pay', 'live')};
is($standby->safe_psql('postgres', $replay), 'replay -', 'a replay on the standby');
is($standby->safe_psql('postgres', $replay), 'replay -', 'and again');
$primary->safe_psql('postgres',
	q{UPDATE idem_keys SET response = '{"v": 2}' WHERE key = 'live'});
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', $replay),
	'replay {"v": 2}', 'a record changed on the primary replays its new version');
is($standby->safe_psql('postgres', $replay),
	'replay {"v": 2}', 'and again, the new version');

# Promotion: the launcher starts and the new primary is swept
$primary->stop;
$standby->promote;
ok( $standby->poll_query_until(
		'postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'}),
	'after promotion the launcher starts');
ok($standby->poll_query_until('postgres', "SELECT ($state) = '0 1 0 3'"),
	'and sweeps: expired records deleted, old processing records flagged');

# (the WAL receiver's complaint when the primary stops is expected)
is(log_errors($standby, except => [qr/ walreceiver /]), '', 'no errors in the standby\'s log');

$standby->stop;
done_testing();
