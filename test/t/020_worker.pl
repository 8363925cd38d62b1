# The background worker in one database: the launcher in pg_stat_activity,
# expiry within two sweep intervals, stuck flagging with its NOTIFY payload,
# reconcilers (one completes, one releases, one raises and the worker goes
# on), SIGHUP changing the interval, idempotency.enabled = off pausing it,
# and the launcher coming back after pg_terminate_backend.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node log_errors);
use Time::HiRes qw(time usleep);
use JSON::PP;

my $interval = 1.0;    # seconds, as set below

my $node = start_node('worker', q{
log_line_prefix = '%m [%p] %b '
idempotency.sweep_interval = '1s'
idempotency.processing_timeout = '200ms'
});

# Poll a query in a session until it returns 't'; seconds taken, or undef
sub wait_for
{
	my ($session, $sql, $timeout) = @_;
	my $t0 = time;
	while (time - $t0 < $timeout)
	{
		return time - $t0 if $session->query_safe($sql) eq 't';
		usleep(50_000);
	}
	return undef;
}

ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
WHERE backend_type = 'idempotency launcher' AND datid IS NULL}),
	'the launcher shows in pg_stat_activity, connected to no database');

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $s = $node->background_psql('postgres');

# Expiry: completed records with a short ttl go within two intervals of
# expiring; a live completed record, and processing or stuck records whose
# expires_at has passed, stay
$node->safe_psql(
	'postgres', q{
SELECT idem_reserve('pay', 'e' || i, ttl => '300 ms'), idem_complete('pay', 'e' || i)
FROM generate_series(1, 3) i;
SELECT idem_reserve('pay', 'live', ttl => '1 hour'), idem_complete('pay', 'live');
SELECT idem_reserve('pay', 'proc', ttl => '1 hour');
UPDATE idem_keys SET expires_at = now() - interval '1 minute' WHERE key = 'proc';
});
my $expiry = $node->safe_psql('postgres',
	q{SELECT extract(epoch FROM max(expires_at)) FROM idem_keys WHERE key LIKE 'e_'});
ok(defined wait_for($s, q{SELECT count(*) = 0 FROM idem_keys WHERE key LIKE 'e_'}, 15),
	'expired completed records are deleted');
my $late = $s->query_safe(
	"SELECT round((extract(epoch FROM clock_timestamp()) - $expiry)::numeric, 2)");
cmp_ok($late, '<=', 2 * $interval,
	"... within two sweep intervals of expiring ($late s)");
is( $s->query_safe(q{SELECT string_agg(key || ':' || status, ',' ORDER BY key) FROM idem_keys}),
	'live:completed,proc:stuck',
	'the live completed record stays; the old processing one is flagged, not deleted');
is($s->query_safe(q{SELECT expired || ' ' || flagged_stuck FROM idem_stats WHERE operation = 'pay'}),
	'3 1', 'idem_stats counts what the worker deleted and flagged');

# Stuck flagging: one NOTIFY idem_stuck per record, JSON naming scope,
# operation and key (escaped)
my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN idem_stuck');
$node->safe_psql(
	'postgres', q{
SELECT idem_reserve('ship', k, scope => 'tenant-1')
FROM (VALUES ('s1'), ('s2'), ('k "q" \\')) v(k)});
ok( defined wait_for(
		$s,
		q{SELECT count(*) FILTER (WHERE status = 'stuck') = 3 FROM idem_keys WHERE scope = 'tenant-1'},
		15),
	'processing records older than processing_timeout are flagged stuck');
my $out = $listener->query_safe('SELECT 1');
my @payloads =
  map { decode_json($_) }
  ($out =~ /^Asynchronous notification "idem_stuck" with payload "(.*)" received from server process with PID \d+\.$/mg);
my @mine = sort { $a->{key} cmp $b->{key} } grep { $_->{scope} eq 'tenant-1' } @payloads;
is(scalar(@mine), 3, 'one notification per flagged record');
is_deeply(
	\@mine,
	[
		{ scope => 'tenant-1', operation => 'ship', key => 'k "q" \\' },
		{ scope => 'tenant-1', operation => 'ship', key => 's1' },
		{ scope => 'tenant-1', operation => 'ship', key => 's2' }
	],
	'the payload is JSON naming scope, operation and key');
$listener->quit;

# Reconcilers, registered by an application role and run as that role
$node->safe_psql(
	'postgres', q{
CREATE ROLE app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys, idem_reconcilers TO app;
GRANT EXECUTE ON FUNCTION idem_complete(text, text, jsonb, integer, text, text),
	idem_release(text, text, text), idem_set_reconciler(text, regprocedure) TO app;
CREATE TABLE calls (key text, who name);
GRANT INSERT ON calls TO app;
CREATE FUNCTION reconcile_charge(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.calls VALUES (r.key, current_user);
	IF r.key LIKE 'paid%' THEN
		PERFORM public.idem_complete(r.operation, r.key, '{"reconciled": true}', 201, 'ch_' || r.key, r.scope);
	ELSIF r.key LIKE 'void%' THEN
		PERFORM public.idem_release(r.operation, r.key, r.scope);
	ELSE
		RAISE EXCEPTION 'gateway unreachable';
	END IF;
END $$;
SET ROLE app;
SELECT idem_set_reconciler('charge', 'reconcile_charge(idem_keys)');
RESET ROLE;
SELECT idem_reserve('charge', k) FROM (VALUES ('paid-1'), ('void-1'), ('boom-1')) v(k);
});
ok( defined wait_for(
		$s, q{
SELECT (SELECT status FROM idem_keys WHERE operation = 'charge' AND key = 'paid-1') = 'completed'
   AND NOT EXISTS (SELECT FROM idem_keys WHERE operation = 'charge' AND key = 'void-1')},
		15),
	'the worker calls the reconciler: one key completed, another released');
is( $s->query_safe(
		q{SELECT response_status || ' ' || response::text || ' ' || resource_id FROM idem_keys WHERE key = 'paid-1'}),
	'201 {"reconciled": true} ch_paid-1',
	'the completed key carries the reconciler\'s result');
is( $s->query_safe(q{SELECT string_agg(DISTINCT who::text, ',') FROM calls}),
	'app', 'the reconciler runs as the role that registered it');
is($s->query_safe(q{SELECT status FROM idem_keys WHERE key = 'boom-1'}),
	'stuck', 'the key whose reconciler raised stays stuck');

# The error is logged with the key, and the worker goes on: a new stuck key
# is settled, and the failing reconciler is called again after a delay that
# grows with each failure (idem_reconciler_status)
$node->safe_psql('postgres', q{SELECT idem_reserve('charge', 'paid-2')});
ok( defined wait_for(
		$s, q{SELECT status = 'completed' FROM idem_keys WHERE operation = 'charge' AND key = 'paid-2'},
		15),
	'a key flagged after the failure is reconciled too');
ok( $node->wait_for_log(
		qr/WARNING:  reconciler public\.reconcile_charge\(public\.idem_keys\) failed for idempotency key "boom-1"\n.*DETAIL:  Operation "charge", scope "". The reconciler raised: gateway unreachable/,
		0),
	'the reconciler error is logged as a WARNING naming the key');
is( $s->query_safe(
		q{SELECT state || ': ' || reason FROM idem_reconciler_status WHERE key = 'boom-1'}),
	'backed off: it raised: gateway unreachable',
	'idem_reconciler_status shows the failing key backed off, with the reason');
ok(defined wait_for($s, q{SELECT attempts >= 2 FROM idem_reconciler_status WHERE key = 'boom-1'}, 30),
	'the failing reconciler is called again after its delay');
# the attempt is counted before the call, its WARNING logged after it fails
my $failures = 0;
for (1 .. 300)
{
	$failures = () = slurp_file($node->logfile) =~ /failed for idempotency key "boom-1"/g;
	last if $failures >= 2;
	usleep(100_000);
}
cmp_ok($failures, '>=', 2, "the failing reconciler is retried at later passes ($failures calls)");
$node->safe_psql('postgres', q{SELECT idem_release('charge', 'boom-1')});

# SIGHUP: a one-hour interval stops the passes, a short one resumes them
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.sweep_interval = '1h'; SELECT pg_reload_conf()});
sleep(2);    # let a pass under way finish
$node->safe_psql('postgres',
	q{SELECT idem_reserve('pay', 'h1', ttl => '1 ms'), idem_complete('pay', 'h1')});
sleep(3);
is($s->query_safe(q{SELECT count(*) FROM idem_keys WHERE key = 'h1'}),
	'1', 'with sweep_interval = 1h after a reload, an expired record stays');
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.sweep_interval = '500ms'; SELECT pg_reload_conf()});
my $took = wait_for($s, q{SELECT count(*) = 0 FROM idem_keys WHERE key = 'h1'}, 15);
ok(defined $took && $took <= 2.0,
	'back to a short interval after a reload, it is deleted within two intervals of the reload ('
	  . ($took // 'never') . ' s)');

# idempotency.enabled = off pauses the worker; on resumes it
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.enabled = off; SELECT pg_reload_conf()});
sleep(1);
$node->safe_psql(
	'postgres', q{
SELECT idem_reserve('pay', 'p1', ttl => '1 ms'), idem_complete('pay', 'p1');
SELECT idem_reserve('pay', 'p2');
});
sleep(3);
is( $s->query_safe(
		q{SELECT string_agg(key || ':' || status, ',' ORDER BY key) FROM idem_keys WHERE key IN ('p1', 'p2')}),
	'p1:completed,p2:processing',
	'with enabled = off nothing is deleted or flagged');
is( $s->query_safe(
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'}),
	'1', 'the paused launcher stays, idle');
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.enabled = on; SELECT pg_reload_conf()});
ok( defined wait_for(
		$s, q{
SELECT NOT EXISTS (SELECT FROM idem_keys WHERE key = 'p1')
   AND (SELECT status FROM idem_keys WHERE key = 'p2') = 'stuck'}, 15),
	'with enabled = on again, the worker resumes');

# pg_terminate_backend stops the launcher; the postmaster starts it again
my $pid = $s->query_safe(
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'});
$s->query_safe("SELECT pg_terminate_backend($pid)");
ok( defined wait_for(
		$s, qq{
SELECT count(*) = 1 FROM pg_stat_activity
WHERE backend_type = 'idempotency launcher' AND pid <> $pid}, 30),
	'a terminated launcher is restarted');
$node->safe_psql('postgres',
	q{SELECT idem_reserve('pay', 'r1', ttl => '1 ms'), idem_complete('pay', 'r1')});
ok(defined wait_for($s, q{SELECT count(*) = 0 FROM idem_keys WHERE key = 'r1'}, 15),
	'and it serves the database again');
$s->quit;

# SIGTERM at shutdown is prompt
my $t0 = time;
$node->stop('fast');
cmp_ok(time - $t0, '<', 5, 'a fast shutdown is not held up by the worker');

is(log_errors($node), '', 'no errors in the server log');

done_testing();
