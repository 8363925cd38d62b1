#!/usr/bin/env bash
# The release metadata agrees with itself and `make dist` builds a PGXN
# distribution: META.json follows the PGXN meta spec, its versions are the
# control file's, the files it names are tracked sources (not build
# artefacts), and the zip made from a git commit of this tree has them all
# under NAME-VERSION/ and builds the install script of that version.
set -euo pipefail
cd "$(dirname "$0")/../.."
bad=0
pgc=${PGBIN:+$PGBIN/}pg_config

ok() { echo "ok: $1"; }
fail() {
	echo "FAIL: $1"
	bad=1
}

version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
[ -n "$version" ] && ok "the control file says $version" || fail "no default_version in idempotency.control"

# META.json against the PGXN meta spec 1.0.0 (its required keys and values)
if out=$(python3 - "$version" <<'PY'
import json, re, sys
version = sys.argv[1]
m = json.load(open("META.json"))
problems = []
for key in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
    if key not in m:
        problems.append("no %s" % key)
semver = re.compile(r"^\d+\.\d+\.\d+$")
if m.get("version") != version:
    problems.append("version %r is not the control file's %r" % (m.get("version"), version))
if m.get("meta-spec", {}).get("version") != "1.0.0":
    problems.append("meta-spec version is not 1.0.0")
if m.get("license") not in ("postgresql", "bsd", "mit", "apache_2_0", "gpl_3"):
    problems.append("license %r is not the PostgreSQL License" % m.get("license"))
if m.get("release_status") not in ("stable", "testing", "unstable"):
    problems.append("release_status %r is not stable, testing or unstable" % m.get("release_status"))
for name, p in m.get("provides", {}).items():
    if p.get("version") != version:
        problems.append("provides.%s.version %r is not %r" % (name, p.get("version"), version))
    if not semver.match(p.get("version", "")):
        problems.append("provides.%s.version is not semantic" % name)
    for f in ("file", "docfile"):
        if f in p:
            print(p[f])
for url in re.findall(r'"(https?://[^"]+)"', open("META.json").read()):
    if url != "http://pgxn.org/meta/spec.txt":
        problems.append("URL %s: META.json names no URL but the spec's" % url)
if problems:
    sys.stderr.write("\n".join(problems) + "\n")
    sys.exit(1)
PY
); then
	ok "META.json follows the meta spec and says version $version"
else
	fail "META.json"
fi
provided=$out

# The Debian changelog's upstream version, when there is one
if [ -f debian/changelog ]; then
	deb=$(sed -n '1s/^[^ ]* (\([^)-]*\)-[^)]*).*/\1/p' debian/changelog)
	[ "$deb" = "$version" ] && ok "debian/changelog's upstream version is $version" ||
		fail "debian/changelog's upstream version is \"$deb\", not $version"
fi

# The CHANGELOG's newest section is this version
top=$(sed -n 's/^## \([0-9][^ ]*\).*/\1/p' CHANGELOG.md | head -n 1)
[ "$top" = "$version" ] && ok "CHANGELOG.md's newest section is $version" ||
	fail "CHANGELOG.md's newest section is \"$top\", not $version"

# Releases are frozen: the install script of each release, by its sha256
# as released.  An earlier release's is kept as idempotency--V.sql; the
# current version's, once it is released, is idempotency.sql itself, until
# the next version starts (doc/development.md, "Cutting a release").  A
# release's CHANGELOG section is dated, and the Debian changelog of the
# current version names a distribution once it is released.
declare -A released=(
	[0.1.0]=6ee7063b1daa4db2b1b5df5024cd19258f445301f5f83a3005a46c0755a2f92a
	[0.2.0]=633c5c56f7940a1e5f138623bae708caffe6ebace5fc6e758820b2fe4e037882
)
for v in $(printf '%s\n' "${!released[@]}" | sort -V); do
	# (idempotency--$version.sql is make's copy of idempotency.sql)
	if [ "$v" = "$version" ]; then
		f=idempotency.sql
	elif [ -f "idempotency--$v.sql" ]; then
		f=idempotency--$v.sql
	else
		fail "release $v has no install script idempotency--$v.sql"
		continue
	fi
	if [ "$(sha256sum "$f" | cut -d' ' -f1)" = "${released[$v]}" ]; then
		ok "$f is the install script of $v as released"
	else
		fail "$f is not the install script of $v as released: a released script never changes, a catalog change starts the next version"
	fi
done
if [ -n "${released[$version]:-}" ]; then
	grep -qE "^## $version \([0-9]{4}-[0-9]{2}-[0-9]{2}\)$" CHANGELOG.md &&
		ok "CHANGELOG.md dates release $version" ||
		fail "CHANGELOG.md's section of release $version has no date"
	head -n 1 debian/changelog | grep -q ' UNRELEASED;' &&
		fail "debian/changelog of release $version says UNRELEASED" ||
		ok "debian/changelog of release $version names a distribution"
fi

# The file names the docs tell a user to type are the ones this version's
# build makes (the zip, its folder, the Debian package)
named=$(grep -ohE 'idempotency-[0-9]+\.[0-9]+\.[0-9]+(\.zip|/)|idempotency_[0-9]+\.[0-9]+\.[0-9]+-[0-9]+_' \
	README.md doc/*.md | sort -u || true)
wrong=$(grep -vE "idempotency[-_]$version([-_/]|\.zip)" <<<"$named" || true)
[ -n "$named" ] && [ -z "$wrong" ] && ok "the docs name this version's zip and package ($(echo $named))" ||
	fail "the docs name files of another version: ${wrong:-none named at all}"

[ -f LICENSE ] && grep -q 'The idempotency developers' LICENSE && ok "LICENSE names the copyright holder" ||
	fail "no LICENSE naming the idempotency developers"

# make dist in a git repository holding this tree, as a commit would
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rsync -a --exclude .git --exclude results --exclude output_iso --exclude tmp_check ./ "$tmp/repo/"
(
	cd "$tmp/repo"
	git init -q
	git add -A
	git -c user.name=test -c user.email=test@localhost commit -q -m dist
) || fail "could not commit the tree to a scratch repository"
for f in $provided; do
	if (cd "$tmp/repo" && git ls-files --error-unmatch "$f" >/dev/null 2>&1); then
		ok "META.json's $f is a tracked file"
	else
		fail "META.json's $f is not a tracked file (generated, ignored or missing)"
	fi
done

if make -s -C "$tmp/repo" PG_CONFIG="$pgc" dist >"$tmp/dist.log" 2>&1; then
	ok "make dist"
else
	cat "$tmp/dist.log"
	fail "make dist"
fi
zip=$tmp/repo/idempotency-$version.zip
if [ -f "$zip" ]; then
	python3 -m zipfile -l "$zip" | awk 'NR > 1 { print $1 }' >"$tmp/list"
	outside=$(grep -v "^idempotency-$version/" "$tmp/list" || true)
	[ -z "$outside" ] && ok "every file is under idempotency-$version/" || fail "files outside idempotency-$version/: $outside"
	for f in META.json LICENSE README.md Makefile idempotency.control \
		idempotency--0.1.0.sql idempotency--0.1.0--0.2.0.sql idempotency--0.2.0.sql \
		idempotency--0.2.0--"$version".sql $provided doc/*.md; do
		grep -qx "idempotency-$version/$f" "$tmp/list" && ok "the zip has $f" || fail "the zip lacks $f"
	done
	grep -qx "idempotency-$version/idempotency--$version.sql" "$tmp/list" &&
		fail "the zip holds the generated idempotency--$version.sql" ||
		ok "the zip holds no generated install script"
	(cd "$tmp" && python3 -m zipfile -e "$zip" unpacked)
	if make -s -C "$tmp/unpacked/idempotency-$version" PG_CONFIG="$pgc" \
		"idempotency--$version.sql" >"$tmp/build.log" 2>&1 &&
		cmp -s "$tmp/unpacked/idempotency-$version/idempotency--$version.sql" "idempotency--$version.sql"; then
		ok "the unpacked zip builds the same install script of $version"
	else
		cat "$tmp/build.log"
		fail "the unpacked zip does not build the install script of $version"
	fi
else
	fail "make dist made no idempotency-$version.zip"
fi
exit $bad
