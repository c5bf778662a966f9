#!/usr/bin/env bash
# Installs what the tests need (scripts/setup-tests.sh), then runs every
# check: rustfmt and clippy, the Rust unit and integration tests, a bounded
# coverage-guided fuzz run of every decoder, and the Python integration
# tests against real PostgreSQL 15 (PostgreSQL's own regression suite on a
# lazy compute among them). Everything runs the `checked` build: release
# optimizations with debug assertions and overflow checks.
# Environment: STRATA_FUZZ_SECONDS (default 60; 0 skips the fuzz run),
# STRATA_TEST_WORKERS (pytest processes side by side, default 3; 1 runs the
# tests one after another).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-tests.sh
# STRATA_MINIO: the S3 server the remote storage tests start.
. scripts/minio.sh
if ! command -v cargo >/dev/null 2>&1; then export PATH="$HOME/.cargo/bin:$PATH"; fi

echo "== cargo fmt --check, cargo clippy"
cargo fmt --all --check
cargo clippy --locked --workspace --all-targets --quiet -- -D warnings

echo "== cargo test"
cargo test --profile checked --locked --workspace --quiet

fuzz_seconds="${STRATA_FUZZ_SECONDS:-60}"
if [ "$fuzz_seconds" -gt 0 ]; then
    echo "== fuzz (${fuzz_seconds}s per target)"
    ./fuzz/run.sh "$fuzz_seconds"
fi

# Every build of this run succeeded: the cache is built from these sources.
./scripts/source-times.sh record

echo "== pytest"
# The clusters of the tests need room; a full disk shows as timeouts.
df -h . "${TMPDIR:-/tmp}"
# Three workers on two cores: most tests spend part of their time waiting
# on their cluster (docs/testing.md, "Time").
workers="${STRATA_TEST_WORKERS:-3}"
# Every run lists its slowest tests (docs/testing.md keeps the last list)
# and records every test's time, so that the next run starts the longest
# first (test_runner/fixtures/order.py); an idle worker steals queued tests.
durations=(--durations=25 --durations-min=5)
if [ "$workers" -gt 1 ]; then
    .venv/bin/pytest test_runner -n "$workers" --dist worksteal "${durations[@]}" "$@"
else
    .venv/bin/pytest test_runner "${durations[@]}" "$@"
fi
