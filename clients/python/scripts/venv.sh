# Sourced by test.sh and demo/start.sh: idem_py_venv prints the path of a
# virtual environment with requirements.txt installed, creating it if needed.
#
# Environments and pip's cache live under
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/python, keyed by the hash of
# requirements.txt and the Python version, so a warm cache installs nothing.
# The interpreter is ${IDEM_PYTHON:-/usr/bin/python3} (Debian: python3-venv).

idem_py_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# idem_py_cache: the cache directory (created world-writable and sticky, like
# /tmp, so that root and the postgres user can share it); a private one under
# ${TMPDIR:-/tmp} when it cannot be written.
idem_py_cache() {
	local base="${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}"
	local dir="$base/python"
	if mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ]; then
		chmod 1777 "$base" "$dir" 2>/dev/null || true
	else
		dir="${TMPDIR:-/tmp}/idempotency-cache-$(id -u)/python"
		mkdir -p "$dir"
	fi
	printf '%s\n' "$dir"
}

idem_py_python() {
	local py="${IDEM_PYTHON:-/usr/bin/python3}"
	[ -x "$py" ] || py="$(command -v python3)"
	printf '%s\n' "$py"
}

# idem_py_venv: the environment's path (its progress on stderr).
idem_py_venv() {
	local cache py tag venv
	cache="$(idem_py_cache)"
	py="$(idem_py_python)"
	tag="$({ cat "$idem_py_root/requirements.txt"; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
	venv="$cache/venv-$tag"
	if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
		printf '%s\n' "$venv"
		return 0
	fi
	exec 9>"$cache/.lock-$tag-$(id -u)"
	flock 9
	if [ ! -f "$venv/.complete" ]; then
		# created in place (a moved environment's scripts name the old path);
		# .complete marks it whole, so a run that died halfway is redone
		echo "pg-idempotency: creating $venv" >&2
		rm -rf "$venv"
		"$py" -m venv "$venv" >&2
		PIP_CACHE_DIR="$cache/pip" nice -n 10 "$venv/bin/python" -m pip install --disable-pip-version-check \
			--no-input -q -r "$idem_py_root/requirements.txt" >&2
		chmod -R a+rX "$venv"
		touch "$venv/.complete"
	fi
	exec 9>&-
	printf '%s\n' "$venv"
}
