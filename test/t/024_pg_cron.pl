# The maintenance scheduled with pg_cron (Debian's postgresql-15-cron)
# instead of the worker, on a server that does not preload idempotency at
# all: no worker runs and nothing fails, the SQL functions work, and the
# recipe of doc/worker.md (CALL idem_maintain() every minute, or SELECT idem_sweep())
# deletes expired records, flags stuck ones and calls reconcilers.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(log_errors);

# Not every suite packages pg_cron for every version (none for 19 yet)
my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
plan skip_all => "pg_cron is not installed (no postgresql-NN-cron for this version)"
  unless -e "$sharedir/extension/pg_cron.control";

my $node = PostgreSQL::Test::Cluster->new('cron');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'pg_cron'
cron.database_name = 'postgres'
cron.use_background_workers = on
max_worker_processes = 16
log_line_prefix = '%m [%p] %b '
idempotency.processing_timeout = '200ms'
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});
$node->start;

$node->safe_psql('postgres', 'CREATE EXTENSION pg_cron');
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}),
	'0', 'without shared_preload_libraries no idempotency worker runs');

# Records for both jobs: expired ones, old processing ones to flag and
# reconcile, a live one
$node->safe_psql(
	'postgres', q{
CREATE TABLE calls (key text, xid xid8 DEFAULT pg_current_xact_id());
CREATE FUNCTION reconcile_charge(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.calls VALUES (r.key);
	IF r.key LIKE 'paid%' THEN
		PERFORM public.idem_complete(r.operation, r.key, '{"reconciled": true}', 201, NULL, r.scope);
	ELSE
		PERFORM public.idem_release(r.operation, r.key, r.scope);
	END IF;
END $$;
SELECT idem_set_reconciler('charge', 'reconcile_charge(idem_keys)');
SELECT idem_reserve('pay', 'e' || i, ttl => '1 ms'), idem_complete('pay', 'e' || i)
FROM generate_series(1, 20) i;
SELECT idem_reserve('pay', 'live', ttl => '1 hour'), idem_complete('pay', 'live');
SELECT idem_reserve('charge', k) FROM (VALUES ('paid-1'), ('void-1')) v(k);
});

# The recipe
$node->safe_psql(
	'postgres', q{
SELECT cron.schedule('idempotency-maintain', '* * * * *', 'CALL idem_maintain()');
SELECT cron.schedule('idempotency-sweep', '* * * * *', 'SELECT idem_sweep()');
});

# pg_cron 1.4 runs jobs at the top of each minute
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(DISTINCT jobid) = 2 FROM cron.job_run_details
WHERE status IN ('succeeded', 'failed')}),
	'both jobs ran');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(j.jobname || ': ' || d.status, ', ' ORDER BY j.jobname)
FROM cron.job_run_details d JOIN cron.job j USING (jobid)}),
	'idempotency-maintain: succeeded, idempotency-sweep: succeeded',
	'both succeeded');
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(operation || '/' || key || ':' || status, ',' ORDER BY key) FROM idem_keys}),
	'pay/live:completed,charge/paid-1:completed',
	'expired records deleted, stuck records flagged and reconciled, the live one kept');
is($node->safe_psql('postgres', q{SELECT string_agg(key, ',' ORDER BY key) FROM calls}),
	'paid-1,void-1', 'the reconciler was called once per stuck record');
is($node->safe_psql('postgres', q{SELECT count(DISTINCT xid) FROM calls}),
	'2', 'under pg_cron, CALL idem_maintain() gives each reconciler call its own transaction');

is(log_errors($node, warnings => 1), '', 'no errors in the log');

$node->stop;
done_testing();
