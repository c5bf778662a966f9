"""Shared fixtures for the Strata integration tests.

Run from the repository root with ``.venv/bin/pytest test_runner``.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Do not leave __pycache__ directories behind for the modules imported from
# here on (see also pytest_unconfigure).
sys.dont_write_bytecode = True

TEST_RUNNER_DIR = Path(__file__).resolve().parent
REPO_ROOT = TEST_RUNNER_DIR.parent
if str(TEST_RUNNER_DIR) not in sys.path:
    sys.path.insert(0, str(TEST_RUNNER_DIR))

from fixtures import order  # noqa: E402
from fixtures.pg import PgCluster, temp_root  # noqa: E402
from fixtures.ports import confine_to_share  # noqa: E402

# Tests run in parallel processes (pytest-xdist's "gw0", "gw1", ...): each
# takes its own part of the port range, for itself and the clusters it starts.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    confine_to_share(int(os.environ["PYTEST_XDIST_WORKER"][2:]), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))

# Fixtures defined in modules of fixtures/: `cluster_factory` and `cluster`
# (the local cluster driven through the `strata` command line).
pytest_plugins = ["fixtures.cluster"]

PG_MAJOR = 15


def pytest_configure(config):
    # Each run records its tests' times; the next starts the longest first
    # (fixtures/order.py).
    order.configure(config)


def pytest_collection_modifyitems(config, items):
    order.reorder(config, items)


def pytest_unconfigure(config):
    # pytest caches this conftest, rewritten for assertions, before it runs;
    # remove that cache so that a test run leaves the tree as it found it.
    for d in (TEST_RUNNER_DIR / "__pycache__", TEST_RUNNER_DIR / "fixtures" / "__pycache__"):
        shutil.rmtree(d, ignore_errors=True)


def _find_pg_bin_dir(major: int = PG_MAJOR) -> Path:
    """PostgreSQL server binaries of `major`: $PG_BIN_DIR (15 only), then
    `pg_config --bindir` (of that major), then the Debian/Ubuntu layout."""
    env = os.environ.get("PG_BIN_DIR")
    if env and major == PG_MAJOR:
        return Path(env)
    candidates = []
    for pg_config in (f"/usr/lib/postgresql/{major}/bin/pg_config", "pg_config"):
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    candidates.append(Path(f"/usr/lib/postgresql/{major}/bin"))
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_waldump").exists():
            return c
    return candidates[0]


def pg_bin_dir_of(major: int) -> Path:
    """The checked binaries of PostgreSQL `major`, or the test fails saying
    how to install them (docs/postgres-versions.md)."""
    d = _find_pg_bin_dir(major)
    missing = [p for p in ("initdb", "pg_ctl", "postgres", "pg_waldump") if not (d / p).exists()]
    if missing:
        how = "scripts/setup.sh" if major == PG_MAJOR else f"scripts/postgres-build.sh {major}"
        pytest.fail(f"PostgreSQL {major} binaries not found in {d} (missing {', '.join(missing)}); "
                    f"install postgresql-{major} ({how})")
    out = subprocess.run([str(d / "postgres"), "--version"], capture_output=True, text=True, timeout=30)
    version = out.stdout.strip()
    if f"(PostgreSQL) {major}." not in version:
        pytest.fail(f"expected PostgreSQL {major} in {d}, found: {version!r}")
    return d


@pytest.fixture(scope="session")
def pg_bin_dir() -> Path:
    return pg_bin_dir_of(PG_MAJOR)


@pytest.fixture(scope="session")
def strata_bin() -> Path:
    # The suite runs the `checked` build: release optimizations with debug
    # assertions and overflow checks (docs/decisions.md). STRATA_BIN: another
    # build of the same tree (a suite run that must not see the next rebuild).
    path = Path(os.environ.get("STRATA_BIN", REPO_ROOT / "target" / "checked" / "strata"))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"Strata binary not found at {path}; build it first with "
                    f"`cargo build --profile checked` in {REPO_ROOT}")
    return path


@pytest.fixture
def pg_cluster_factory(pg_bin_dir, tmp_path, tmp_path_factory):
    """Creates PgCluster objects (not yet initialised) in fresh directories
    under the test's tmp_path, of PostgreSQL 15 or another major; every
    cluster is stopped at teardown, even on failure."""
    clusters = []
    # The server user must be able to reach tmp_path from the pytest root.
    traverse_root = temp_root(tmp_path_factory)

    def make(name: str = "pg", major: int = PG_MAJOR) -> PgCluster:
        base = tmp_path / f"{name}{len(clusters)}"
        bin_dir = pg_bin_dir if major == PG_MAJOR else pg_bin_dir_of(major)
        cluster = PgCluster(bin_dir, base, traverse_root=traverse_root)
        clusters.append(cluster)
        return cluster

    yield make
    errors = []
    for c in clusters:
        try:
            c.cleanup()
        except Exception as e:  # keep stopping the others
            errors.append(f"{c}: {e}")
    if errors:
        pytest.fail("failed to stop cluster(s): " + "; ".join(errors))


@pytest.fixture
def pg_cluster(pg_cluster_factory) -> PgCluster:
    """A fresh, not yet initialised cluster."""
    return pg_cluster_factory()
