# One reconciler's failure costs only its own record, and the worker's log
# stays readable (issue 41, items 3 and 4).
# - A reconciler that is skipped at every pass is reported once per cause:
#   one WARNING while its function is missing, one more when the function
#   is back but cannot be a reconciler, however many passes skip it; the
#   view idem_reconciler_status shows it with the reason.
# - A reconciler that catches its cancel in a loop, next to an honest one
#   whose record is younger: the first pass ends with the worker's process
#   at the stubborn record; the next passes leave that record for a growing
#   delay (shown in idem_reconciler_status) and reconcile the honest one.
#   With log_min_messages = log the message naming the stubborn key is in
#   the log (at LOG, where a WARNING would not be).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node wait_for set_conf);

my $node = start_node('reconciler_backoff', q{
idempotency.sweep_interval = '200ms'
idempotency.reconciler_timeout = '2s'
idempotency.max_workers = 1
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});

# The worker reports a skip again after processing_timeout: an hour in
# this database, whose records are made stuck by hand.  The log is read
# from before the stuck record exists: the worker may skip it at once.
my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('postgres', q{ALTER DATABASE shop SET idempotency.processing_timeout = '1h'});
$node->safe_psql('shop', q{
CREATE EXTENSION idempotency;
CREATE FUNCTION public.gone(r idem_keys) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT idem_set_reconciler('gone', 'public.gone(idem_keys)');
DROP FUNCTION public.gone(idem_keys);
SELECT idem_reserve('gone', 'g1');
UPDATE idem_keys SET status = 'stuck';
});

#
# A skipped reconciler: one WARNING per cause
#
ok(defined wait_for($node, 'shop', q{SELECT attempts >= 5 FROM idem_reconciler_status
	WHERE operation = 'gone' AND state = 'skipped'}, 60),
	'the reconciler without a function is skipped pass after pass');
my @skips = (slurp_file($node->logfile, $offset) =~ /WARNING:  reconciler public\.gone\(public\.idem_keys\) of operation "gone" was skipped/g);
is(scalar @skips, 1, 'and reported once');
is($node->safe_psql('shop', q{SELECT reason FROM idem_reconciler_status WHERE operation = 'gone'}),
	'no function has its signature', 'the view says why');
$node->safe_psql('shop',
	q{CREATE FUNCTION public.gone(r idem_keys) RETURNS SETOF int LANGUAGE sql AS $$ SELECT 1 $$});
ok(defined wait_for($node, 'shop', q{SELECT reason = 'its function cannot be a reconciler' AND attempts >= 5
	FROM idem_reconciler_status WHERE operation = 'gone'}, 60),
	'its cause changes when the function is back but returns a set');
@skips = (slurp_file($node->logfile, $offset) =~ /WARNING:  reconciler public\.gone\(public\.idem_keys\) of operation "gone" was skipped/g);
is(scalar @skips, 2, 'and is reported once more');
$node->safe_psql('shop', q{SELECT idem_set_reconciler('gone', NULL); DELETE FROM idem_keys});

#
# A stubborn reconciler next to an honest one
#
set_conf($node, q{log_min_messages = 'log'});
$offset = -s $node->logfile;
$node->safe_psql('shop', q{
CREATE FUNCTION public.stubborn(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	LOOP
		BEGIN
			PERFORM pg_sleep(600);
		EXCEPTION WHEN query_canceled THEN
			NULL;
		END;
	END LOOP;
END $$;
CREATE FUNCTION public.honest(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM idem_release(r.operation, r.key, r.scope);
END $$;
SELECT idem_set_reconciler('stubborn', 'public.stubborn(idem_keys)');
SELECT idem_set_reconciler('honest', 'public.honest(idem_keys)');
SELECT idem_reserve('stubborn', 's1');
UPDATE idem_keys SET status = 'stuck';
});
# the honest record is younger: the stubborn one is first in every pass
$node->safe_psql('shop', q{SELECT pg_sleep(0.2); SELECT idem_reserve('honest', 'h1');
	UPDATE idem_keys SET status = 'stuck' WHERE key = 'h1'});

ok(defined wait_for($node, 'shop', q{SELECT count(*) = 0 FROM idem_keys WHERE key = 'h1'}, 30),
	'the honest reconciler\'s record is settled');
is($node->safe_psql('shop', q{SELECT status FROM idem_keys WHERE key = 's1'}), 'stuck',
	'the stubborn one\'s record stays stuck');
like($node->safe_psql('shop', q{SELECT state || ': ' || reason || ', next attempt in '
	|| CASE WHEN next_attempt - last >= interval '10 s' THEN 'at least 10 s' ELSE 'less' END
	FROM idem_reconciler_status WHERE operation = 'stubborn' AND key = 's1'}),
	qr/^backed off: its process was ended during the call, next attempt in at least 10 s$/,
	'idem_reconciler_status shows it backed off, with the reason and the delay');
like(slurp_file($node->logfile, $offset),
	qr/LOG:  reconciler public\.stubborn\(public\.idem_keys\) did not end at its time limit for idempotency key "s1"/,
	'with log_min_messages = log, the message naming the key is logged');

# its next attempt, once due, ends its process again: the delay doubles
ok(defined wait_for($node, 'shop', q{SELECT attempts >= 2 AND next_attempt - last >= interval '20 s'
	FROM idem_reconciler_status WHERE key = 's1'}, 60),
	'the next failure doubles the delay');

$node->stop('fast');
done_testing();
