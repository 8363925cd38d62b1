#!/usr/bin/env bash
# Minimal Debian roots made with debootstrap, cached, for running the suite
# (or anything else) as a fresh Debian machine would.  Needs root.
#
#   bash test/debroot.sh make NAME      make the root if it is not cached; print its path
#   bash test/debroot.sh run NAME [--copy HOSTDIR:ROOTDIR]... [--bind HOSTDIR:ROOTDIR]... [--] CMD [ARG]...
#                                       run CMD as root inside a throwaway copy of the root;
#                                       --copy copies a tree in first, --bind mounts a host
#                                       directory there for the run (to keep what it makes)
#   bash test/debroot.sh shell NAME     an interactive shell, the same way
#   bash test/debroot.sh list           the cached roots
#   bash test/debroot.sh remove NAME    delete a cached root
#
# NAME is a Debian suite: bookworm (PostgreSQL 15), trixie (17), sid (18),
# or experimental: sid with experimental's packages preferred for
# PostgreSQL 19 (postgresql-19*, libpq*), everything else from sid.
#
# The cached root is debootstrap's minbase plus apt sources for its suite,
# written inside the root only: this machine's own apt sources are never
# touched.  Nothing else is installed: a command run in it installs what it
# needs with apt-get, as on a fresh machine, and creates users (postgres)
# through the packages.  Each run works on an overlay over the cached root
# that is thrown away afterwards, so every run starts from the same fresh
# root; downloaded .deb files are kept per root (apt's archive cache is
# bind-mounted) so a second run does not fetch them again.
#
# A run happens in its own mount and PID namespaces (unshare): /proc, /sys,
# /dev, /dev/pts and /dev/shm are mounted only while the command runs and
# are unmounted by a trap when it ends, and the namespaces make sure of it
# even if the run is killed; every process left in the root (a server the
# command did not stop) ends with it.
#
# Environment: IDEM_ROOTS (default /var/cache/idempotency/roots) is the cache
# directory; IDEM_MIRROR (default: the deb.debian.org URI of this machine's
# apt sources) the Debian mirror.
#
# Sourced (source test/debroot.sh), it defines debroot_make NAME and
# debroot_run NAME [--copy ...] CMD... for other scripts (test/matrix.sh).

IDEM_ROOTS=${IDEM_ROOTS:-/var/cache/idempotency/roots}

# The Debian mirror this machine's apt uses (deb822 or one-line sources)
debroot_mirror() {
	if [ -n "${IDEM_MIRROR:-}" ]; then
		echo "$IDEM_MIRROR"
		return
	fi
	local uri
	uri=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
		/etc/apt/sources.list.d/*.list 2>/dev/null |
		sed -nE 's#^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)(https?://[^[:space:]]*/debian)/?([[:space:]].*)?$#\3#p' |
		head -n 1)
	echo "${uri:-http://deb.debian.org/debian}"
}

# The suite debootstrap installs for a root's name
debroot_suite() {
	case "$1" in
		bookworm | trixie | sid) echo "$1" ;;
		experimental) echo sid ;;
		*)
			echo "debroot: unknown root \"$1\" (bookworm, trixie, sid or experimental)" >&2
			return 1
			;;
	esac
}

# The configuration debroot_configure writes; a cached root made with an
# older one is configured again
DEBROOT_CONFIG_VERSION=2

# Write the root's own configuration: apt sources, no expiry check, pins,
# and no daemons started by packages (a chroot has no init to own them:
# the main cluster postgresql-NN creates stays stopped)
debroot_configure() {
	local name=$1 root=$2 mirror suite
	mirror=$(debroot_mirror)
	suite=$(debroot_suite "$name")
	rm -f "$root/etc/apt/sources.list"
	{
		echo "Types: deb"
		echo "URIs: $mirror"
		echo "Suites: $suite"
		echo "Components: main"
		echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
		if [ "$name" = experimental ]; then
			echo
			echo "Types: deb"
			echo "URIs: $mirror"
			echo "Suites: experimental"
			echo "Components: main"
			echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
		fi
	} >"$root/etc/apt/sources.list.d/debian.sources"
	# A mirror snapshot older than its Release file's Valid-Until is still
	# the archive we mean to test against
	echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99idem-no-valid-until"
	if [ "$name" = experimental ]; then
		# PostgreSQL 19 and its libpq come from experimental, the rest from sid
		printf '%s\n' 'Package: postgresql-19* postgresql-client-19* libpq5 libpq-dev' \
			'Pin: release a=experimental' 'Pin-Priority: 500' \
			>"$root/etc/apt/preferences.d/idem-experimental"
	fi
	printf '%s\n' '#!/bin/sh' 'exit 101' >"$root/usr/sbin/policy-rc.d"
	chmod 755 "$root/usr/sbin/policy-rc.d"
}

# Make the cached root NAME unless it exists; print its path
debroot_make() {
	local name=$1 dir base suite
	suite=$(debroot_suite "$name") || return 1
	dir=$IDEM_ROOTS/$name
	base=$dir/base
	if [ -f "$dir/complete" ]; then
		if [ "$(cat "$dir/complete")" != "$DEBROOT_CONFIG_VERSION" ]; then
			debroot_configure "$name" "$base"
			echo "$DEBROOT_CONFIG_VERSION" >"$dir/complete"
		fi
		echo "$base"
		return 0
	fi
	# the one package a root needs on this machine, installed as the suite
	# installs its own (this machine's apt sources are not touched)
	if ! command -v debootstrap >/dev/null; then
		echo "debroot: installing debootstrap" >&2
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				debootstrap >&2 || {
			echo "debroot: could not install debootstrap" >&2
			return 1
		}
	fi
	rm -rf "$dir"
	mkdir -p "$dir/apt-archives/partial"
	echo "debroot: making $name ($suite) in $base" >&2
	if ! debootstrap --variant=minbase "$suite" "$base" "$(debroot_mirror)" \
		>"$dir/debootstrap.log" 2>&1; then
		tail -n 20 "$dir/debootstrap.log" >&2
		echo "debroot: debootstrap of $suite failed; log in $dir/debootstrap.log" >&2
		return 1
	fi
	debroot_configure "$name" "$base"
	rm -rf "$base"/var/cache/apt/archives/*.deb "$base"/var/lib/apt/lists/*_Packages
	echo "$DEBROOT_CONFIG_VERSION" >"$dir/complete"
	echo "$base"
}

# Inside the private namespaces: mount, copy, chroot, and unmount on the way out
debroot_inner() {
	local name=$1 run=$2
	shift 2
	local dir=$IDEM_ROOTS/$name merged=$run/merged copies=() binds=() m
	while [ $# -gt 0 ]; do
		case "$1" in
			--copy) copies+=("$2"); shift 2 ;;
			--bind) binds+=("$2"); shift 2 ;;
			--) shift; break ;;
			*) break ;;
		esac
	done
	DEBROOT_MOUNTS=()
	trap debroot_unmount EXIT
	mkdir -p "$run/upper" "$run/work" "$merged"
	mount -t overlay overlay \
		-o "lowerdir=$dir/base,upperdir=$run/upper,workdir=$run/work" "$merged"
	DEBROOT_MOUNTS+=("$merged")
	for m in proc sys dev dev/pts dev/shm var/cache/apt/archives; do
		mkdir -p "$merged/$m"
	done
	mount -t proc proc "$merged/proc" && DEBROOT_MOUNTS+=("$merged/proc")
	mount -t sysfs sysfs "$merged/sys" && DEBROOT_MOUNTS+=("$merged/sys")
	mount --bind /dev "$merged/dev" && DEBROOT_MOUNTS+=("$merged/dev")
	mount -t devpts -o newinstance,ptmxmode=0666 devpts "$merged/dev/pts" &&
		DEBROOT_MOUNTS+=("$merged/dev/pts")
	mount -t tmpfs -o mode=1777 tmpfs "$merged/dev/shm" && DEBROOT_MOUNTS+=("$merged/dev/shm")
	mount --bind "$dir/apt-archives" "$merged/var/cache/apt/archives" &&
		DEBROOT_MOUNTS+=("$merged/var/cache/apt/archives")
	# The network as this machine sees it: its resolver, and the local CA
	# certificates it was given (those of a TLS-intercepting proxy, say),
	# which ca-certificates picks up when a command installs it; node uses
	# its own list and reads them from NODE_EXTRA_CA_CERTS
	cp -L /etc/resolv.conf "$merged/etc/resolv.conf"
	local c from to cas=() extra_env=()
	shopt -s nullglob
	cas=(/usr/local/share/ca-certificates/*.crt)
	shopt -u nullglob
	if [ ${#cas[@]} -gt 0 ]; then
		mkdir -p "$merged/usr/local/share/ca-certificates"
		cp -L "${cas[@]}" "$merged/usr/local/share/ca-certificates/"
		cat "${cas[@]}" >"$merged/usr/local/share/ca-certificates/debroot-local-cas.pem"
		extra_env=(NODE_EXTRA_CA_CERTS=/usr/local/share/ca-certificates/debroot-local-cas.pem)
	fi
	for c in "${copies[@]}"; do
		from=${c%%:*}
		to=${c#*:}
		mkdir -p "$merged/$to"
		cp -a "$from/." "$merged/$to/"
	done
	for c in "${binds[@]}"; do
		from=${c%%:*}
		to=${c#*:}
		mkdir -p "$merged/$to"
		mount --bind "$from" "$merged/$to" && DEBROOT_MOUNTS+=("$merged/$to")
	done
	local rc=0
	chroot "$merged" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		"${extra_env[@]}" "$@" || rc=$?
	return $rc
}

# Unmount everything debroot_inner mounted, innermost first (its EXIT trap)
debroot_unmount() {
	local rc=$? i
	for ((i = ${#DEBROOT_MOUNTS[@]} - 1; i >= 0; i--)); do
		umount "${DEBROOT_MOUNTS[i]}" 2>/dev/null || umount -l "${DEBROOT_MOUNTS[i]}"
	done
	DEBROOT_MOUNTS=()
	exit $rc
}

# Run a command as root in a throwaway overlay of root NAME; one run of a
# root at a time (they share its apt archive cache)
debroot_run() {
	local name=$1 run rc=0 lock
	shift
	debroot_make "$name" >/dev/null || return 1
	exec {lock}>>"$IDEM_ROOTS/$name/lock"
	if ! flock -n "$lock"; then
		echo "debroot: waiting for another run of $name to end" >&2
		flock "$lock"
	fi
	run=$(mktemp -d "$IDEM_ROOTS/$name/run.XXXXXX")
	unshare --mount --pid --fork --propagation private \
		bash "${BASH_SOURCE[0]}" __inner "$name" "$run" "$@" || rc=$?
	rm -rf "$run"
	exec {lock}>&-
	return $rc
}

# Stop unless running as root: debootstrap, mount and chroot need it
debroot_need_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "$1: must run as root (debootstrap, mount, chroot)" >&2
		exit 1
	fi
}

debroot_main() {
	set -euo pipefail
	debroot_need_root debroot
	local cmd=${1:-}
	shift || true
	case "$cmd" in
		make) debroot_make "$@" ;;
		run) debroot_run "$@" ;;
		shell) debroot_run "$1" /bin/bash -l ;;
		list) ls "$IDEM_ROOTS" 2>/dev/null || true ;;
		remove) rm -rf "${IDEM_ROOTS:?}/${1:?root name}" ;;
		__inner) debroot_inner "$@" ;;
		*)
			sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
			exit 2
			;;
	esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	debroot_main "$@"
fi
