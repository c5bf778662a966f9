#!/usr/bin/env bash
# Installs everything Strata needs on Debian 12 (run as root, idempotent):
# PostgreSQL 15 server and clients, FUSE, a Rust toolchain if none, the Python
# virtual environment for tests and benchmarks, MinIO (the S3 server the tests
# start; built once from its Go module), and the release build.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in postgresql-15 postgresql-client-15 postgresql-contrib fuse3 python3-venv build-essential pkg-config ca-certificates curl; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Do not let the package create and start a default cluster: Strata runs its own.
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/strata.conf
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: a Rust toolchain (1.87 or newer, e.g. from rustup) is required" >&2
    exit 1
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

cargo build --release --locked 2>&1 | tail -n 3
echo "setup: done (binary: target/release/strata)"
