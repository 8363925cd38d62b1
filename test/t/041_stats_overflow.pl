# idempotency.stats_max_operations bounds the named entries of idem_stats.
# Beyond it, calls are counted in the database's overflow row (operation
# NULL) so totals stay exact; idem_stats_reset() frees room; each database
# sees only its own rows; and when even the overflow entries are used up,
# calls still succeed and are only left uncounted.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $max = 10;
my $node = PostgreSQL::Test::Cluster->new('stats_overflow');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\n"
	  . "idempotency.stats_max_operations = $max\n");
$node->start;

# A database with the extension
sub create_db
{
	my ($db) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
create_db($_) for ('db1', 'db2');

# Reserve one new key in each of the given operations, then complete it
sub reserve_ops
{
	my ($db, $prefix, $from, $to) = @_;
	$node->safe_psql(
		$db, qq{
SELECT count(*) FROM generate_series($from, $to) i,
	LATERAL idem_reserve('$prefix' || i, 'k');
SELECT count(idem_complete('$prefix' || i, 'k')) FROM generate_series($from, $to) i;
});
}

my $rows = q{SELECT coalesce(operation, '(overflow)') || ' ' || reserves || ' '
	|| "new" || ' ' || completes FROM idem_stats ORDER BY operation NULLS LAST};

# 8 operations in db1, then 4 in db2: the last 2 of db2 overflow
reserve_ops('db1', 'a', 1, 8);
reserve_ops('db2', 'b', 1, 4);
is( $node->safe_psql('db2', $rows),
	"b1 1 1 1\nb2 1 1 1\n(overflow) 2 2 2",
	'db2: two named operations fit, the other two are counted in the overflow row');
is( $node->safe_psql('db1', "SELECT count(*), sum(reserves) FROM idem_stats"),
	"8|8", 'db1 sees only its own eight rows');

# More calls of an overflowed operation and of new ones keep totals exact
$node->safe_psql(
	'db2', q{
SELECT outcome FROM idem_reserve('b3', 'k');
SELECT outcome FROM idem_reserve('b9', 'k');
SELECT outcome FROM idem_reserve('b1', 'k');
});
is( $node->safe_psql('db2', $rows),
	"b1 2 1 1\nb2 1 1 1\n(overflow) 4 3 2",
	'later calls go to the same rows: a replay in b1, a replay and a new key in the overflow');
is( $node->safe_psql(
		'db2', q{SELECT sum(reserves), sum("new"), sum(replays), sum(completes),
	(SELECT count(*) FROM idem_keys) FROM idem_stats}),
	"7|5|2|4|5", 'the totals of db2 are exact');
is( $node->safe_psql(
		'db2', q{SELECT collision_rate FROM idem_stats WHERE operation IS NULL}),
	'0.25', 'the overflow row has a collision rate too');

# A reset in db1 frees its eight entries; db2 keeps its counters
$node->safe_psql('db1', 'SELECT idem_stats_reset()');
is($node->safe_psql('db1', 'SELECT count(*) FROM idem_stats'),
	'0', 'db1 has no rows after its reset');
is( $node->safe_psql('db2', $rows),
	"b1 2 1 1\nb2 1 1 1\n(overflow) 4 3 2",
	'the reset of db1 leaves db2 alone');
$node->safe_psql('db2', q{SELECT outcome FROM idem_reserve('b20', 'k')});
is( $node->safe_psql('db2', $rows),
	"b1 2 1 1\nb2 1 1 1\nb20 1 1 0\n(overflow) 4 3 2",
	'the freed room takes a new operation of db2');

# Exhaust the overflow entries: $max databases overflow, the next one cannot
$node->safe_psql('db2', 'SELECT idem_stats_reset()');
reserve_ops('db1', 'c', 1, $max);
for my $i (1 .. $max + 1)
{
	create_db("o$i");
	$node->safe_psql("o$i", q{SELECT outcome FROM idem_reserve('x', 'k')});
}
is( $node->safe_psql(
		"o$max", q{SELECT coalesce(operation, '(overflow)') || ' ' || reserves FROM idem_stats}),
	'(overflow) 1', "database o$max is counted in its overflow row");
is( $node->safe_psql(
		'o' . ($max + 1), q{
SELECT outcome FROM idem_reserve('x', 'k2');
SELECT count(*) FROM idem_stats;
SELECT count(*) FROM idem_keys;
}),
	"new\n0\n2", 'with no room left, calls still succeed and are not counted');
ok( $node->log_contains(
		qr/idempotency statistics are full: calls of operation "x" are not counted/),
	'the server log says calls were not counted');

# A reset in one overflowing database makes room for the next
$node->safe_psql('o1', 'SELECT idem_stats_reset()');
$node->safe_psql('o' . ($max + 1), q{SELECT outcome FROM idem_reserve('x', 'k3')});
is( $node->safe_psql(
		'o' . ($max + 1), q{SELECT coalesce(operation, '(overflow)') || ' ' || reserves FROM idem_stats}),
	'(overflow) 1', 'after a reset elsewhere the database is counted again');

$node->stop;
done_testing();
