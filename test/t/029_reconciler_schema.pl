# A reconciler resolves only what its run-as role trusts (issue 22, item 1).
# Its search_path is pinned to pg_catalog, the extension's schema, pg_temp,
# but an overload that is a better match wins whatever the order: in a
# database whose owner is not a superuser, the owner owns public (PostgreSQL
# 15 and later), and the extension in public, and a superuser's reconciler
# that calls jsonb_build_object(text, bigint, text, text) as the README's
# example did, the owner plants public.jsonb_build_object(text, bigint,
# text, text) and is SUPERUSER one worker pass later.  The worker skips that
# reconciler with a WARNING naming the schema and the role, and the planter
# gains nothing; with the extension in a schema of its own (the README's
# install), the same reconciler runs and the planted function is never
# called.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest qw(start_node);
use Time::HiRes qw(time usleep);

my $node = start_node('reconciler_schema', q{
idempotency.sweep_interval = '300ms'
idempotency.processing_timeout = '100ms'
# its reconcilers run as the bootstrap superuser, which the operator allows
idempotency.enable_superuser_reconcilers = on
});

$node->safe_psql('postgres', q{
CREATE ROLE dbowner LOGIN;
CREATE DATABASE shop OWNER dbowner;
CREATE DATABASE safe OWNER dbowner;
});

# The reconciler as the README's example was: unqualified calls, one of
# them with a bigint among its arguments
my $reconciler = q{
CREATE FUNCTION public.reconcile_payment(r %s.idem_keys) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM idem_complete(r.operation, r.key,
		jsonb_build_object('payment_id', 42::bigint, 'status', 'paid'::text),
		201, '42', r.scope);
END $$;
SELECT %s.idem_set_reconciler('pay', 'public.reconcile_payment(%s.idem_keys)');
};
my $plant = q{
CREATE FUNCTION public.jsonb_build_object(text, bigint, text, text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE dbowner SUPERUSER;
	RETURN pg_catalog.jsonb_build_object($1, $2, $3, $4);
END $$;
};
my $is_super = q{SELECT rolsuper FROM pg_roles WHERE rolname = 'dbowner'};

# The extension in public, which the database owner owns
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');
$node->safe_psql('shop', sprintf($reconciler, 'public', 'public', 'public'));
$node->safe_psql('shop', $plant, extra_params => [ '-U', 'dbowner' ]);
my $offset = -s $node->logfile;
$node->safe_psql('shop', q{SELECT public.idem_reserve('pay', 'k1')});
# until the WARNING, or the attack succeeded
my $skipped = qr/WARNING:  reconciler public\.reconcile_payment\(public\.idem_keys\) of operation "pay" was skipped\n.*DETAIL:  Role "dbowner" owns schema "public", which is on the reconciler's search_path, and may not act as role "[^"]+", which it runs as\./;
my $t0 = time;
while (time - $t0 < 30)
{
	last if slurp_file($node->logfile, $offset) =~ $skipped;
	last if $node->safe_psql('shop', q{SELECT status FROM public.idem_keys WHERE key = 'k1'}) eq 'completed';
	usleep(100_000);
}
like(slurp_file($node->logfile, $offset), $skipped,
	'worker: a superuser\'s reconciler in a schema the database owner owns is skipped with a WARNING');
is($node->safe_psql('shop', $is_super), 'f', 'the planter did not become SUPERUSER');
is($node->safe_psql('shop', q{SELECT status FROM public.idem_keys WHERE key = 'k1'}),
	'stuck', 'the record stays stuck');
$offset = -s $node->logfile;
ok( $node->wait_for_log(
		qr/WARNING:  reconciler public\.reconcile_payment\(public\.idem_keys\) of operation "pay" was skipped/,
		$offset),
	'and is skipped again at the next pass');

# The same, with the extension in a schema of its own that only the
# superuser can create in: the reconciler runs, and the planted function
# in public is not on its path
$node->safe_psql('safe', 'CREATE SCHEMA idem; CREATE EXTENSION idempotency SCHEMA idem');
$node->safe_psql('safe', sprintf($reconciler, 'idem', 'idem', 'idem'));
$node->safe_psql('safe', $plant, extra_params => [ '-U', 'dbowner' ]);
$node->safe_psql('safe', q{SELECT idem.idem_reserve('pay', 'k1')});
ok( $node->poll_query_until(
		'safe', q{SELECT status = 'completed' FROM idem.idem_keys WHERE key = 'k1'}),
	'worker: with the extension in its own schema the reconciler completes the record');
is($node->safe_psql('safe', q{SELECT response::text FROM idem.idem_keys WHERE key = 'k1'}),
	'{"status": "paid", "payment_id": 42}', 'with pg_catalog\'s jsonb_build_object');
is($node->safe_psql('safe', $is_super), 'f', 'and the planter did not become SUPERUSER');

# CREATE on that schema granted to PUBLIC: skipped again
$offset = -s $node->logfile;
$node->safe_psql('safe', q{GRANT CREATE ON SCHEMA idem TO PUBLIC; SELECT idem.idem_reserve('pay', 'k2')});
ok( $node->wait_for_log(
		qr/WARNING:  reconciler public\.reconcile_payment\(idem\.idem_keys\) of operation "pay" was skipped\n.*DETAIL:  Every role may create objects in schema "idem"/,
		$offset),
	'worker: with CREATE on the schema granted to PUBLIC, the reconciler is skipped');
is($node->safe_psql('safe', q{SELECT status FROM idem.idem_keys WHERE key = 'k2'}),
	'stuck', 'and the record stays stuck');

$node->stop('fast');
unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no server process crashed');

done_testing();
