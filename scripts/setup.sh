#!/usr/bin/env bash
# Installs what the main job needs on Debian 12 (run as root, idempotent):
# PostgreSQL 15 server and clients, FUSE, and the release build of `strata`.
# The tests' own set-up (Python, MinIO, PostgreSQL's regression suite, the
# build with assertions) is scripts/setup-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

need_packages "${BASE_PACKAGES[@]}"
need_cargo
cargo build --release --locked 2>&1 | tail -n 3
echo "setup: done (binary: target/release/strata)"
