#!/usr/bin/env bash
# Installs PostgreSQL MAJOR (17 or 18) for Strata on a Debian release that
# does not ship it (docs/postgres-versions.md, "Where the binaries come
# from"). Run as root; idempotent, and quick once done.
#
#   scripts/postgres-build.sh 18
#
# - If the machine's release has the package postgresql-MAJOR, installs it
#   from there and stops.
# - Otherwise fetches Debian's own source package of that major from the
#   release that ships it (`apt-get source`, through a deb-src entry of its
#   own in /etc/apt/sources.list.d/), unpacks it with Debian's patches and
#   builds it unmodified with a subset of Debian's configure flags (what
#   the server and its contrib modules need; no PL languages, JIT or docs),
#   into /usr/lib/postgresql/MAJOR (bin/, lib/, share/, include/).
# - Keeps the version's regression suite with its C modules built, as
#   scripts/pg-regress-setup.sh does for 15, in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/strata/pg-regress-<version>.
#
# A stamp (/usr/lib/postgresql/MAJOR/.strata-build) holds the source
# package's version: a second run with the same version only checks it.
# Prints `PG_BIN=<dir>` and `STRATA_PG_REGRESS=<dir>` last.
set -euo pipefail

MAJOR="${1:-}"
case "$MAJOR" in
    17) SUITE=trixie ;;
    18) SUITE=sid ;;
    *) echo "usage: $0 17|18" >&2; exit 2 ;;
esac
PREFIX="/usr/lib/postgresql/$MAJOR"
STAMP="$PREFIX/.strata-build"
SOURCES_FILE="/etc/apt/sources.list.d/strata-deb-src-postgresql.sources"

say() { echo "postgres-build $MAJOR: $*"; }
die() { echo "postgres-build $MAJOR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (apt sources, packages, $PREFIX)"
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -q -o DPkg::Lock::Timeout=600)

# The version of the source package that `apt-get source` would fetch,
# from the suite that ships the major (nothing if apt knows none).
source_version() {
    apt-cache showsrc "postgresql-$MAJOR" 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -n 1
}

# 1. The release's own package, where it has one.
candidate=$(apt-cache policy "postgresql-$MAJOR" 2>/dev/null | sed -n 's/^ *Candidate: //p')
if [ -n "$candidate" ] && [ "$candidate" != "(none)" ]; then
    if ! dpkg-query -W -f='${Status}' "postgresql-$MAJOR" 2>/dev/null | grep -q "install ok installed"; then
        say "installing the release's package postgresql-$MAJOR $candidate"
        "${APT[@]}" install -y -qq --no-install-recommends "postgresql-$MAJOR" "postgresql-server-dev-$MAJOR" >/dev/null
    fi
    echo "PG_BIN=$PREFIX/bin"
    exit 0
fi

# 2. A deb-src entry for the suite that ships the major.
if [ ! -f "$SOURCES_FILE" ] || ! grep -q "$SUITE" "$SOURCES_FILE"; then
    say "adding deb-src entries for trixie and sid ($SOURCES_FILE)"
    cat > "$SOURCES_FILE" <<'EOF'
# Debian's source packages of the PostgreSQL majors this release does not
# ship (scripts/postgres-build.sh of Strata): 17 from trixie, 18 from sid.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    "${APT[@]}" update -qq
fi
version=$(source_version)
[ -n "$version" ] || { "${APT[@]}" update -qq; version=$(source_version); }
[ -n "$version" ] || die "apt knows no source package postgresql-$MAJOR"

STRATA_PG_REGRESS_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/strata"
upstream="${version%%-*}"
regress_dir="$STRATA_PG_REGRESS_DIR/pg-regress-$upstream"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$version" ] && [ -x "$PREFIX/bin/postgres" ] &&
        [ -f "$regress_dir/.complete" ]; then
    echo "PG_BIN=$PREFIX/bin"
    echo "STRATA_PG_REGRESS=$regress_dir"
    exit 0
fi

# 3. What the build needs, from this release.
need=(dpkg-dev gcc make bison flex pkgconf libicu-dev liblz4-dev libzstd-dev libxml2-dev
      libssl-dev libreadline-dev zlib1g-dev uuid-dev)
[ "$MAJOR" -ge 18 ] && need+=(liburing-dev)
say "installing the build's dependencies"
"${APT[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null

# 4. The source, with Debian's patches applied.
work=$(mktemp -d -t strata-pg-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
say "fetching the source of postgresql-$MAJOR $version"
(cd "$work" && "${APT[@]}" source "postgresql-$MAJOR=$version") >"$work/apt-source.log" 2>&1 ||
    { cat "$work/apt-source.log" >&2; die "apt-get source postgresql-$MAJOR=$version failed"; }
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name "postgresql-$MAJOR-*")
grep -q "^PACKAGE_VERSION='$upstream'\$" "$src/configure" ||
    die "the unpacked source in $src is not PostgreSQL $upstream"

# 5. Configure (Debian's flags that concern the server's behaviour and
#    formats: the same tzdata, ICU, compression, OpenSSL, UUID; I/O with
#    io_uring from 18), build the server and contrib, install.
flags=(--prefix="$PREFIX" --with-extra-version=" (Debian $version)"
       --enable-debug --with-openssl --with-icu --with-libxml --with-lz4 --with-zstd
       --with-uuid=e2fs --with-system-tzdata=/usr/share/zoneinfo --with-pgport=5432)
[ "$MAJOR" -ge 18 ] && flags+=(--with-liburing)
say "configuring"
(cd "$src" && ./configure "${flags[@]}" CFLAGS="-O2 -g -fno-omit-frame-pointer") >"$work/configure.log" 2>&1 ||
    { tail -n 40 "$work/configure.log" >&2; die "configure failed"; }
say "building (a few minutes per core)"
jobs=$(nproc)
(cd "$src" && make -s -j"$jobs" world-bin) >"$work/build.log" 2>&1 ||
    { tail -n 40 "$work/build.log" >&2; die "the build failed"; }
rm -rf "$PREFIX.new"
(cd "$src" && make -s install-world-bin prefix="$PREFIX.new") >"$work/install.log" 2>&1 ||
    { tail -n 40 "$work/install.log" >&2; die "the installation failed"; }

# 6. The regression suite and its C modules, built against this tree.
regress="$src/src/test/regress"
(cd "$regress" && make -s -j"$jobs" all) >"$work/regress.log" 2>&1 ||
    { tail -n 40 "$work/regress.log" >&2; die "building the regression suite failed"; }
for m in autoinc refint; do
    (cd "$src/contrib/spi" && make -s "$m.so") >>"$work/regress.log" 2>&1
    cp "$src/contrib/spi/$m.so" "$regress/"
done
chmod -R u+rwX,go+rX,go-w "$regress"
mkdir -p "$STRATA_PG_REGRESS_DIR"
rm -rf "$regress_dir.new"
cp -a "$regress" "$regress_dir.new"
echo "$version" > "$regress_dir.new/.complete"

# Replace any older installation at once.
rm -rf "$PREFIX.old"
[ -d "$PREFIX" ] && mv "$PREFIX" "$PREFIX.old"
mv "$PREFIX.new" "$PREFIX"
rm -rf "$PREFIX.old"
echo "$version" > "$STAMP"
rm -rf "$regress_dir"
mv "$regress_dir.new" "$regress_dir"
say "done"
echo "PG_BIN=$PREFIX/bin"
echo "STRATA_PG_REGRESS=$regress_dir"
