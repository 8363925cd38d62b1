# Every database that has the extension is served with no configuration:
# two at once, one created after start-up, one where the extension is
# installed later.  Templates and databases that refuse connections are not
# visited.  A dropped extension, and databases dropped while the worker
# visits them at a fast pace, leave no error in the log and never make
# DROP DATABASE fail.  At most idempotency.max_workers workers run at once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdemTest;
use Time::HiRes qw(time usleep);

my $node = start_node('databases', q{
log_line_prefix = '%m [%p] %b '
idempotency.sweep_interval = '1s'
idempotency.max_workers = 2
});

# Add n completed records that expired a minute ago, and one live one
sub add_records
{
	my ($db, $n) = @_;
	$node->safe_psql(
		$db, qq{
SELECT idem_reserve('pay', 'x' || i, ttl => '1 hour'), idem_complete('pay', 'x' || i)
FROM generate_series(1, $n) i;
UPDATE idem_keys SET expires_at = now() - interval '1 minute';
SELECT idem_reserve('pay', 'live', ttl => '1 hour'), idem_complete('pay', 'live');
});
}

my $expired = q{SELECT count(*) FROM idem_keys WHERE expires_at < now()};

# Two databases served at once
for my $db ('db1', 'db2')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
# A template and a database that refuses connections: never visited
for my $db ('tpl', 'noconn')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
# A database without the extension, to install it later
$node->safe_psql('postgres', 'CREATE DATABASE later');

$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.enabled = off');
$node->reload;
sleep(1);
add_records($_, 100) for ('db1', 'db2', 'tpl', 'noconn');
$node->safe_psql('postgres', q{ALTER DATABASE tpl IS_TEMPLATE true});
$node->safe_psql('postgres', q{ALTER DATABASE noconn ALLOW_CONNECTIONS false});
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.enabled = on');
$node->reload;

for my $db ('db1', 'db2')
{
	ok(defined wait_for($node, $db, "SELECT ($expired) = 0", 10),
		"$db: expired records are deleted");
	is($node->safe_psql($db, 'SELECT count(*) FROM idem_keys'),
		'1', "$db: the live record stays");
}
sleep(2);
is($node->safe_psql('tpl', $expired), '100', 'a template database is not visited');
# Pause to look inside noconn: the worker must not get there first
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.enabled = off; SELECT pg_reload_conf()});
sleep(1);
$node->safe_psql('postgres', q{ALTER DATABASE noconn ALLOW_CONNECTIONS true});
is($node->safe_psql('noconn', $expired),
	'100', 'a database with datallowconn = false is not visited');
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.enabled = on; SELECT pg_reload_conf()});
ok(defined wait_for($node, 'noconn', "SELECT ($expired) = 0", 10),
	'... and is served once it accepts connections');

# A database created after start-up, and an extension installed later
$node->safe_psql('postgres', 'CREATE DATABASE created');
$node->safe_psql('created', 'CREATE EXTENSION idempotency');
add_records('created', 10);
my $took = wait_for($node, 'created', "SELECT ($expired) = 0", 10);
ok(defined $took && $took <= 2.0,
	'a database created after start-up is served within two intervals ('
	  . ($took // 'never') . ' s)');
$node->safe_psql('later', 'CREATE EXTENSION idempotency');
add_records('later', 10);
$took = wait_for($node, 'later', "SELECT ($expired) = 0", 10);
ok(defined $took && $took <= 2.0,
	'an extension installed after start-up is served within two intervals ('
	  . ($took // 'never') . ' s)');

# A dropped extension stops being served, quietly
$node->safe_psql('db2', 'DROP EXTENSION idempotency');
sleep(3);

# Databases dropped while the worker visits them every 50 ms; meanwhile
# count the workers running at once
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.sweep_interval = '50ms'; SELECT pg_reload_conf()});
my $sampler = $node->background_psql('postgres');
$sampler->query_until(
	qr/sampling/, q{
\echo sampling
CREATE TEMP TABLE samples AS SELECT 0 AS n WHERE false;
DO $$
BEGIN
	FOR i IN 1..400 LOOP
		PERFORM pg_stat_clear_snapshot();
		INSERT INTO samples SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'idempotency worker';
		PERFORM pg_sleep(0.01);
	END LOOP;
END $$;
});
my $drops_ok = 0;
for my $i (1 .. 8)
{
	$node->safe_psql('postgres', "CREATE DATABASE churn$i");
	$node->safe_psql("churn$i", 'CREATE EXTENSION idempotency');
	add_records("churn$i", 50);
	usleep(100_000 + 37_000 * $i);
	my ($rc, $out, $err) = $node->psql('postgres', "DROP DATABASE churn$i");
	$drops_ok++ if $rc == 0;
	diag("DROP DATABASE churn$i: $err") if $rc != 0;
}
is($drops_ok, 8, 'DROP DATABASE of a database the worker visits never fails');
my $max = $sampler->query_safe(q{SELECT max(n) || ' ' || count(*) FILTER (WHERE n > 0) FROM samples});
my ($most, $busy) = split / /, $max;
cmp_ok($busy, '>', 0, "workers were seen running ($busy samples)");
cmp_ok($most, '<=', 2, "at most idempotency.max_workers run at once (saw $most)");
$sampler->quit;

# The databases that remain are still served
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET idempotency.sweep_interval = '1s'; SELECT pg_reload_conf()});
add_records('db1', 5);
ok(defined wait_for($node, 'db1', "SELECT ($expired) = 0", 10),
	'the remaining databases are still served');

is(log_errors($node, offset => $log_offset, warnings => 1), '',
	'no errors in the log: dropped extension, dropped databases, template, no connections');

$node->stop;
done_testing();
