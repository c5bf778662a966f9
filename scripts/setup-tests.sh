#!/usr/bin/env bash
# Installs what the tests need on Debian 12 (run as root, idempotent): the
# packages of the main job, the Python virtual environment of the tests and
# benchmarks, MinIO (the S3 server the tests start; built once from its Go
# module), PostgreSQL's own regression suite (scripts/pg-regress-setup.sh),
# the other PostgreSQL majors the tests run (scripts/postgres-build.sh: 18,
# built from Debian's source package where the release does not ship it),
# and the `checked` build the tests run: release optimizations with debug
# assertions and overflow checks (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# iproute2: the network namespaces of the tests across hosts (test_runner/fixtures/netns.py);
# nftables and faketime: the partitions between those hosts and their clock steps in the chaos runs.
# chromium (and openssl, for its certificate pin): the browser the console's tests drive through Playwright.
need_packages "${BASE_PACKAGES[@]}" python3-venv curl iproute2 nftables faketime chromium openssl
need_cargo
# CI checks formatting and lints too.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    command -v rustup >/dev/null 2>&1 && rustup component add rustfmt clippy
    cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 ||
        { echo "setup: the rustfmt and clippy components are required" >&2; exit 1; }
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r test_runner/requirements.txt

# shellcheck source=scripts/minio.sh
. scripts/minio.sh
if [ ! -x "$STRATA_MINIO" ]; then
    if ! command -v go >/dev/null 2>&1; then
        echo "setup: Go (1.24 or newer) is required to build MinIO, the S3 server of the tests" >&2
        exit 1
    fi
    echo "setup: building MinIO $MINIO_VERSION from its Go module (once; several minutes)"
    GOBIN="$(dirname "$STRATA_MINIO")" go install "github.com/minio/minio@$MINIO_VERSION"
fi

./scripts/pg-regress-setup.sh | tail -n 1
# PostgreSQL 18 (docs/postgres-versions.md): a few minutes the first time.
./scripts/postgres-build.sh 18 | tail -n 2

# The PostgreSQL JDBC driver, for a Java client of the proxy
# (test_runner/test_proxy.py): from Maven Central, once per clone.
JDBC_VERSION=42.7.14
need_packages openjdk-17-jdk-headless maven
if [ ! -f ".jdbc/postgresql-$JDBC_VERSION.jar" ]; then
    mvn -q -B dependency:copy "-Dartifact=org.postgresql:postgresql:$JDBC_VERSION" -DoutputDirectory=.jdbc
fi

# Build output outlives a clone: `target` (and the fuzzer's) is a link into
# a cache directory, so a CI run on a clean clone reuses what the previous
# run built (a fresh machine builds everything once). The cache is readable
# by everyone: PostgreSQL, running as its own user, executes `strata` as its
# restore command. STRATA_BUILD_CACHE names another directory; "none", or an
# existing `target`, keeps the build inside the clone.
cache="${STRATA_BUILD_CACHE:-/var/cache/strata/build}"
if [ "$cache" != none ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
    for dir in target fuzz/target; do
        if [ ! -e "$dir" ] && [ ! -L "$dir" ]; then
            mkdir -p "$cache/$dir"
            chmod 755 "$cache" "$cache/$dir"
            ln -s "$cache/$dir" "$dir"
        fi
    done
fi

# A clone's files are all new to cargo: give the unchanged ones the age of
# the cache's build (scripts/source-times.sh; test.sh records it).
./scripts/source-times.sh restore
cargo build --profile checked --locked 2>&1 | tail -n 3
echo "setup-tests: done (binary: target/checked/strata)"
