# Helpers shared by the TAP tests in test/t: polling a query while the
# background worker works, and changing a server setting.  A test loads it
# with "use FindBin; use lib $FindBin::RealBin; use IdemTest;".
package IdemTest;

use strict;
use warnings;
use Exporter 'import';
use Time::HiRes qw(time usleep);

our @EXPORT = qw(wait_for set_conf);

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

1;
