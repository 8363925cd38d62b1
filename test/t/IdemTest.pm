# Helpers shared by the TAP tests in test/t: a node that preloads the
# library, polling a query while the background worker works, changing a
# server setting, and reading the server log for errors.  A test loads it
# with "use FindBin; use lib $FindBin::RealBin; use IdemTest;".
package IdemTest;

use strict;
use warnings;
use Exporter 'import';
use Time::HiRes qw(time usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils ();

our @EXPORT = qw(start_node wait_for set_conf log_errors);

# A new node named $name that preloads the library, with the further
# postgresql.conf lines $conf, started
sub start_node
{
	my ($name, $conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idempotency'\n" . ($conf // ''));
	$node->start;
	return $node;
}

# Run $sql in database $db of $node until it returns 't' (an error counts as
# not yet); the seconds that took, or undef after $timeout seconds
sub wait_for
{
	my ($node, $db, $sql, $timeout) = @_;
	my $t0 = time;
	while (time - $t0 < $timeout)
	{
		my ($rc, $out) = $node->psql($db, $sql);
		return time - $t0 if $rc == 0 && $out eq 't';
		usleep(100_000);
	}
	return undef;
}

# Change a server setting of $node with ALTER SYSTEM and reload
sub set_conf
{
	my ($node, $setting) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET $setting; SELECT pg_reload_conf()");
	return;
}

# The lines of $node's server log (from byte offset, 0 by default) that
# report an error: ERROR, FATAL or PANIC, and WARNING too with warnings
# => 1; less the lines matching one of the patterns of except, and the
# FATAL a shutdown or restart gives whatever still runs then (a client
# whose quit the server has not seen yet, a worker in the middle of a
# pass): "terminating ... due to administrator command".  Joined by
# newlines: '' when there is none.
sub log_errors
{
	my ($node, %opt) = @_;
	my $levels = $opt{warnings} ? 'ERROR|FATAL|PANIC|WARNING' : 'ERROR|FATAL|PANIC';
	my @except = (qr/FATAL:  terminating .* due to administrator command/,
		@{ $opt{except} // [] });
	my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile, $opt{offset} // 0);
	my @errors;
	foreach my $line (split /\n/, $log)
	{
		next unless $line =~ /\b($levels):/;
		next if grep { $line =~ $_ } @except;
		push @errors, $line;
	}
	return join("\n", @errors);
}

1;
