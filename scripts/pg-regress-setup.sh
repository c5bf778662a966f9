#!/usr/bin/env bash
# Prepares PostgreSQL's own regression suite for test_runner/test_pg_regress.py
# (docs/regression-suite.md). Run as root on Debian 12; idempotent, and quick
# once done. It
#
# - adds deb-src entries for bookworm and bookworm-security (its own file in
#   /etc/apt/sources.list.d/) unless an apt source has one for bookworm,
# - installs dpkg-dev, gcc and postgresql-server-dev-15 (pg_regress, the server
#   headers) at the installed server's exact version,
# - fetches the installed server's source (`apt-get source
#   postgresql-15=<installed version>`: 15.18 from bookworm, or a newer
#   security release) and keeps only its src/test/regress, in a cache
#   outside the repository,
# - builds the suite's C modules there against the server headers:
#   regress.so, and the contrib/spi modules its triggers test loads
#   (autoinc.so, refint.so).
#
# Prints `STRATA_PG_REGRESS=<dir>` last: the suite's directory (sql/,
# expected/, data/, parallel_schedule, resultmap and the modules), by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/strata/pg-regress-<version>, where the test
# looks for it too. Set STRATA_PG_REGRESS to use another directory (for both).
set -euo pipefail

PG_MAJOR=15
PG_BIN="/usr/lib/postgresql/$PG_MAJOR/bin"
PG_REGRESS="/usr/lib/postgresql/$PG_MAJOR/lib/pgxs/src/test/regress/pg_regress"
SOURCES_FILE="/etc/apt/sources.list.d/strata-deb-src.sources"

say() { echo "pg-regress-setup: $*"; }
die() { echo "pg-regress-setup: $*" >&2; exit 1; }

[ -x "$PG_BIN/postgres" ] || die "PostgreSQL $PG_MAJOR is not installed (run scripts/setup.sh first)"
# "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> 15.18
pg_version=$("$PG_BIN/postgres" --version | sed -n 's/^postgres (PostgreSQL) \([0-9][0-9.]*\).*/\1/p')
[ -n "$pg_version" ] || die "cannot read the version of $PG_BIN/postgres"
deb_version=$(dpkg-query -W -f='${Version}' "postgresql-$PG_MAJOR" 2>/dev/null) ||
    die "package postgresql-$PG_MAJOR is not installed"
case "$deb_version" in
    "$pg_version"-*) ;;
    *) die "package postgresql-$PG_MAJOR is $deb_version but $PG_BIN/postgres says $pg_version" ;;
esac

STRATA_PG_REGRESS="${STRATA_PG_REGRESS:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/pg-regress-$pg_version}"
stamp="$STRATA_PG_REGRESS/.complete"

# installed PACKAGE [VERSION]: whether PACKAGE is installed (at VERSION).
installed() {
    local status
    status=$(dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null) || return 1
    case "$status" in
        "install ok installed ${2:-}"*) return 0 ;;
        *) return 1 ;;
    esac
}

# Quick path: everything is in place.
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$deb_version" ] && [ -x "$PG_REGRESS" ] &&
        installed "postgresql-server-dev-$PG_MAJOR" "$deb_version"; then
    echo "STRATA_PG_REGRESS=$STRATA_PG_REGRESS"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (apt sources and packages); or set STRATA_PG_REGRESS to a prepared suite"
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt or dpkg run (a set-up running beside this one).
APT=(apt-get -q -o DPkg::Lock::Timeout=600)
updated=0
apt_update() {
    local i
    [ "$updated" -eq 0 ] || return 0
    for i in 1 2 3 4 5 6 7 8 9 10; do
        if "${APT[@]}" update -qq; then
            updated=1
            return 0
        fi
        say "apt-get update failed (attempt $i), trying again in 30 s"
        sleep 30
    done
    die "apt-get update keeps failing"
}

# 1. A deb-src entry for bookworm, unless an apt source has one (one-line
#    style in *.list, or deb822 style in *.sources like Debian 12's own).
has_deb_src() {
    grep -Eqs '^[[:space:]]*deb-src[[:space:]].*[[:space:]]bookworm[[:space:]]' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list && return 0
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # A stanza (paragraph) whose Types include deb-src and whose Suites
        # include bookworm.
        awk 'function flush() { if (src && suite) found = 1; src = suite = 0 }
             /^[ \t]*$/ { flush(); next }
             tolower($1) == "types:" && /[ \t]deb-src([ \t]|$)/ { src = 1 }
             tolower($1) == "suites:" && /[ \t]bookworm([ \t]|$)/ { suite = 1 }
             END { flush(); exit !found }' "$f" && return 0
    done
    return 1
}
if ! has_deb_src; then
    say "adding a deb-src entry for bookworm ($SOURCES_FILE)"
    cat > "$SOURCES_FILE" <<'EOF'
# Debian's source packages, for PostgreSQL's regression suite
# (scripts/pg-regress-setup.sh of Strata). The same mirrors as debian.sources.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt_update
fi

# 2. dpkg-dev (apt-get source unpacks with dpkg-source), gcc, and the server's
#    development files at the installed server's version: the candidate may
#    be a newer security release, and pg_regress and the headers must match.
need=()
installed dpkg-dev || need+=(dpkg-dev)
installed gcc || need+=(gcc)
installed "postgresql-server-dev-$PG_MAJOR" "$deb_version" || need+=("postgresql-server-dev-$PG_MAJOR=$deb_version")
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    log=$(mktemp)
    if ! "${APT[@]}" install -y -qq --no-install-recommends "${need[@]}" >"$log" 2>&1; then
        apt_update
        "${APT[@]}" install -y -qq --no-install-recommends "${need[@]}" >"$log" 2>&1 ||
            { cat "$log" >&2; rm -f "$log"; die "installing ${need[*]} failed"; }
    fi
    rm -f "$log"
fi
[ -x "$PG_REGRESS" ] || die "$PG_REGRESS is missing after installing postgresql-server-dev-$PG_MAJOR"
PG_CONFIG="$PG_BIN/pg_config"

# 3. The source of exactly the installed version, unpacked with Debian's
#    patches applied, in a scratch directory.
work=$(mktemp -d -t strata-pg-source.XXXXXX)
trap 'rm -rf "$work"' EXIT
# By exact version: bookworm has the release's, bookworm-security a newer
# one that a fresh installation may have taken.
say "fetching the source of postgresql-$PG_MAJOR $deb_version"
fetch() { (cd "$work" && "${APT[@]}" source "postgresql-$PG_MAJOR=$deb_version") >"$work/apt-source.log" 2>&1; }
if ! fetch; then
    apt_update
    fetch || { cat "$work/apt-source.log" >&2; die "apt-get source postgresql-$PG_MAJOR=$deb_version failed"; }
fi
dsc=$(ls "$work"/postgresql-"$PG_MAJOR"_*.dsc)
src_version=$(sed -n 's/^Version: //p' "$dsc")
[ "$src_version" = "$deb_version" ] ||
    die "apt-get source postgresql-$PG_MAJOR=$deb_version gives $src_version"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name "postgresql-$PG_MAJOR-*")
grep -q "^PACKAGE_VERSION='$pg_version'\$" "$src/configure" ||
    die "the unpacked source in $src is not PostgreSQL $pg_version"

# 4. The C modules, against the installed server's headers, with its flags.
regress="$src/src/test/regress"
# shellcheck disable=SC2207 # pg_config prints flags as one word list
cflags=($("$PG_CONFIG" --cflags) $("$PG_CONFIG" --cflags_sl) $("$PG_CONFIG" --cppflags))
inc=$("$PG_CONFIG" --includedir-server)
say "building regress.so, autoinc.so and refint.so"
gcc "${cflags[@]}" -I"$inc" -shared -o "$regress/regress.so" "$regress/regress.c"
# contrib/spi's Makefile adds -DREFINT_VERBOSE "for the regression tests".
for m in autoinc refint; do
    gcc "${cflags[@]}" -DREFINT_VERBOSE -I"$inc" -shared -o "$regress/$m.so" "$src/contrib/spi/$m.c"
done

# 5. Keep the suite, readable by anyone (PostgreSQL's server runs as its own
#    user and reads the modules and the data files; the test copies the
#    suite where that user can reach it), and replace any older copy at once.
chmod -R u+rwX,go+rX,go-w "$regress"
mkdir -p "$(dirname "$STRATA_PG_REGRESS")"
rm -rf "$STRATA_PG_REGRESS.new"
mv "$regress" "$STRATA_PG_REGRESS.new"
echo "$deb_version" > "$STRATA_PG_REGRESS.new/.complete"
rm -rf "$STRATA_PG_REGRESS"
mv "$STRATA_PG_REGRESS.new" "$STRATA_PG_REGRESS"
say "done"
echo "STRATA_PG_REGRESS=$STRATA_PG_REGRESS"
