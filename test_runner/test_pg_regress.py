"""PostgreSQL's own regression suite (docs/regression-suite.md): the full
parallel schedule of each major's own source, run with ``pg_regress
--use-existing`` once against stock PostgreSQL of that major on local disk
and once against a lazy compute of a local Strata cluster whose tenant is
of that major. The same tests must pass on both, the same way.

The suite and its C modules come from ``scripts/pg-regress-setup.sh``; the
test fails, never skips, when they are missing.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import psycopg
import pytest

from fixtures.checks import read_every_page
from fixtures.endpoint import Endpoint
from fixtures.pg import temp_root
from fixtures.versions import DEFAULT_MAJOR, MAJORS
import fixtures.pg_regress as pg_regress_module
from fixtures.pg_regress import (DATABASE, SETUP_SCRIPT, RegressRun, SuiteMissing, copy_suite,
                                 create_regression_database, find_suite, ignored_tests, keep_stock_run,
                                 load_stock_run, run_pg_regress, schedule_tests, stock_cache_key)

# One run of the whole parallel schedule, on either side.
RUN_TIMEOUT = 3600

# The settings of a compute (compute/src/agent/pgconf.rs) that the suite can
# observe or that change how fast it runs, given to stock PostgreSQL too:
# prepared_xacts expects max_prepared_transactions > 0 (pg_regress's own
# temporary instance sets 2; its alternative output is for 0).
STOCK_SETTINGS = {
    "max_prepared_transactions": 100,
    "max_connections": 100,
    "shared_buffers": "128MB",
    "wal_level": "replica",
    "wal_log_hints": True,
    "full_page_writes": False,
    "fsync": False,
    "timezone": "UTC",
    "log_timezone": "UTC",
    "datestyle": "iso, mdy",
    "lc_messages": "C",
    "default_text_search_config": "pg_catalog.english",
}
# Settings that differ between the two servers and that no test of the
# suite sees: where each listens and keeps its files, and how a compute
# ships its WAL (a synchronous standby, the proposer; block images; no
# local crash recovery). Any other difference fails the test.
MAY_DIFFER = {
    "port", "unix_socket_directories", "data_directory", "config_file", "hba_file", "ident_file",
    "synchronous_standby_names", "wal_consistency_checking", "wal_compression", "wal_keep_size",
    "restart_after_crash",
    # A compute's PostgreSQL serves TLS with its host's certificate.
    "ssl", "ssl_cert_file", "ssl_key_file", "ssl_min_protocol_version",
}


def settings(conninfo: dict) -> dict[str, str]:
    """Every setting as a session of the suite sees it (in the database, over TCP)."""
    with psycopg.connect(**conninfo, autocommit=True, connect_timeout=30) as conn:
        return dict(conn.execute("SELECT name, setting FROM pg_settings").fetchall())


def run_suite(name, suite, tmp_path, pg_bin_dir, *, host, port, user, password=None) -> RegressRun:
    run = run_pg_regress(name, suite, tmp_path / f"out-{name}", pg_bin_dir, host=host, port=port, user=user,
                         timeout=RUN_TIMEOUT, password=password)
    print(f"\n{run.summary()}")
    assert run.statuses, (f"{name}: pg_regress ran no test (exit code {run.returncode})\n"
                          f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}")
    return run


def excerpt(run: RegressRun, test: str, limit: int = 3000) -> str:
    text = run.diffs.get(test)
    if not text:
        return ""
    cut = text[:limit] + (f"\n[... {len(text) - limit} more characters]" if len(text) > limit else "")
    return f"--- {run.name}: {test} (regression.diffs) ---\n{cut}\n"


def compare(stock: RegressRun, lazy: RegressRun, scheduled: list[str], ignored: set[str],
            shown: int = 8) -> list[str]:
    """What differs between the two runs (nothing: an empty list): tests
    not run, tests with another status on each side, tests failing on both
    with different diffs; with the regression.diffs excerpts of the first
    `shown` of those tests."""
    problems = []
    for run in (stock, lazy):
        if run.tests != scheduled:
            missing = [t for t in scheduled if t not in run.statuses]
            extra = [t for t in run.tests if t not in scheduled]
            problems.append(f"{run.name} did not run the whole schedule in order: missing {missing}, "
                            f"unexpected {extra}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    differing = []
    for test in scheduled:
        s, l_ = stock.statuses.get(test), lazy.statuses.get(test)
        if test in ignored or s is None or l_ is None:
            continue  # an `ignore:` test (random) may fail anywhere; missing ones are reported above
        if s != l_:
            differing.append((test, f"{s} on {stock.name}, {l_} on {lazy.name}"))
        elif s == "FAILED" and stock.diff(test) != lazy.diff(test):
            differing.append((test, "FAILED on both, with different differences"))
    if differing:
        problems.append("tests that differ: " + "; ".join(f"{t}: {why}" for t, why in differing))
        for test, _ in differing[:shown]:
            problems.append(excerpt(stock, test) + excerpt(lazy, test))
        if len(differing) > shown:
            problems.append(f"[the diffs of {len(differing) - shown} more tests are in the runs' regression.diffs: "
                            f"{stock.outputdir}, {lazy.outputdir}]")
    return problems


def table_contents(ep: Endpoint) -> dict[str, tuple]:
    """Rows and an md5 of the sorted rows of every permanent table and
    materialized view of the regression database."""
    out = {}
    with ep.connect(DATABASE) as conn:
        rels = conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'm') AND c.relpersistence = 'p' "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "ORDER BY 1").fetchall()
        for (rel,) in rels:
            out[rel] = conn.execute(f"SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) "
                                    f"FROM {rel} t").fetchone()
    return out


@pytest.mark.parametrize("major", MAJORS)
def test_the_regression_suite_passes_alike_on_stock_postgres_and_a_lazy_compute(
        pg_cluster_factory, cluster_factory, pg_bin_dir, tmp_path, tmp_path_factory, major):
    """The full parallel schedule against stock PostgreSQL, then against a
    lazy endpoint (one after the other): both run every test of the
    schedule in order, and each test ends the same on both (a test that
    fails on both must fail with the same differences, which is the
    environment's doing, and is reported). Then the endpoint restarts,
    lazily from the storage, and every permanent table the suite left reads
    the same as before.

    The tablespace test runs on both. PostgreSQL 15 and 18 make *in-place*
    tablespaces (allow_in_place_tablespaces: directories in `pg_tblspc`,
    nothing outside the data directory); on a compute those are on its
    local disk, beside the FUSE mounts, and the test creates, uses and drops
    them within one run of PostgreSQL. They would not survive a restart:
    the pageserver serves no tablespace but pg_default and pg_global
    (docs/decisions.md), which the suite does not need."""
    if major != DEFAULT_MAJOR:
        pg_bin_dir = Path(f"/usr/lib/postgresql/{major}/bin")
    pg_cluster = pg_cluster_factory("pg", major=major)
    try:
        suite_cache = find_suite(pg_bin_dir)
    except SuiteMissing as e:
        pytest.fail(str(e), pytrace=False)
    suite = copy_suite(suite_cache, tmp_path / "suite", temp_root(tmp_path_factory))
    scheduled = schedule_tests(suite / "parallel_schedule")
    ignored = ignored_tests(suite / "parallel_schedule")
    assert len(scheduled) > 200 and "tablespace" in scheduled, scheduled

    # Stock PostgreSQL of the major on local disk; a clean run of the same server,
    # suite, settings and code is kept and stands in for running it again
    # (STRATA_REGRESS_STOCK_CACHE=none runs it every time).
    key = stock_cache_key(pg_bin_dir, suite_cache, STOCK_SETTINGS, Path(__file__), Path(pg_regress_module.__file__))
    kept = load_stock_run(key)
    if kept is not None:
        stock, stock_settings = kept
        print(f"\nstock run kept from an earlier run of the same server and suite ({key}): {stock.summary()}")
    else:
        pg_cluster.initdb()
        pg_cluster.start(STOCK_SETTINGS)
        create_regression_database(pg_cluster.connect)
        # Through the Unix socket as the superuser, as the compute's
        # suite connects (the regression suite makes roles and reads files).
        stock_conninfo = pg_cluster.conninfo(DATABASE)
        stock_settings = settings(stock_conninfo)
        stock = run_suite("stock", suite, tmp_path, pg_bin_dir, host=stock_conninfo["host"],
                          port=pg_cluster.port, user=stock_conninfo["user"])
        pg_cluster.stop()
        # Kept only once the lazy run is known to match it (below).

    # A lazy endpoint (the default) of a local cluster whose tenant is of
    # the same major.
    cluster = cluster_factory() if major == DEFAULT_MAJOR else cluster_factory(init_args=("--pg-version", str(major)))
    ep = Endpoint(cluster, "regress", pg_bin_dir=pg_bin_dir)
    started = time.monotonic()
    ep.start()
    print(f"lazy endpoint started in {time.monotonic() - started:.1f} s")
    assert len(ep.lazy_mounts()) == 2, f"not a lazy compute: mounts {ep.lazy_mounts()}"
    create_regression_database(ep.connect)
    lazy_conninfo = ep.conninfo(DATABASE)
    lazy_settings = settings(lazy_conninfo)
    lazy = run_suite("lazy", suite, tmp_path, pg_bin_dir, host=str(lazy_conninfo["host"]),
                     port=int(lazy_conninfo["port"]), user=str(lazy_conninfo["user"]),
                     password=lazy_conninfo.get("password"))
    agent = ep.agent_status()
    print(f"lazy compute's file system: {agent['lazy']}")

    differing = {k for k in stock_settings.keys() | lazy_settings.keys()
                 if stock_settings.get(k) != lazy_settings.get(k)}
    print(f"settings that differ: {', '.join(sorted(differing))}")
    differing -= MAY_DIFFER
    assert not differing, "settings differ between stock and the compute: " + ", ".join(
        f"{k} = {stock_settings.get(k)!r} / {lazy_settings.get(k)!r}" for k in sorted(differing))

    problems = compare(stock, lazy, scheduled, ignored)
    assert not problems, (f"{stock.summary()}\n{lazy.summary()}\n\n" + "\n".join(problems)
                          + f"\n\n{ep.logs()}\n(the suite is prepared by {SETUP_SCRIPT})")
    if kept is None and keep_stock_run(key, stock, stock_settings, ignored):
        print(f"stock run kept as {key}")

    # One PostgreSQL served the whole run on its FUSE-served files: no
    # restart of the compute, no failed fetch.
    lazy_fs = agent["lazy"]
    assert agent["state"] == "running" and agent["restarts"] == 0, (agent, ep.logs())
    assert lazy_fs is not None and lazy_fs["fetch_errors"] == 0 and lazy_fs["blocks_fetched"] > 0, lazy_fs

    # What the suite left is in the storage: a new compute reads it alike.
    before = table_contents(ep)
    ep.restart()
    after = table_contents(ep)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, [(k, before.get(k), after.get(k)) for k in changed[:20]]
    print(f"after a restart of the endpoint, the {len(after)} tables the suite left read the same")
    # Every page of the regression database, read through PostgreSQL's
    # buffer manager: with data checksums on (18's initdb default), each
    # page Strata served, built or redid is verified.
    checksums = ep.sql("SHOW data_checksums")[0][0]
    blocks = read_every_page(ep, "regression")
    print(f"every page of the regression database read ({blocks} blocks), data_checksums = {checksums}")
    if major >= 18:
        assert checksums == "on"

    both = sorted(stock.failed & lazy.failed)
    if both:
        warnings.warn(f"PostgreSQL's regression suite fails on stock PostgreSQL too, in the same way: "
                      f"{', '.join(both)} (see the runs' regression.diffs)")


def test_only_a_clean_stock_run_is_kept_and_any_change_gives_another_key(tmp_path, monkeypatch):
    """The kept stock run (above): a run with a failed test, or one that
    pg_regress ended with an error, is never kept; a kept one reads back
    whole; the key changes with the server binary, a file of the suite and
    the settings."""
    monkeypatch.setenv("STRATA_REGRESS_STOCK_CACHE", str(tmp_path / "kept"))
    bin_dir, suite = tmp_path / "bin", tmp_path / "suite"
    (suite / "sql").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "postgres").write_bytes(b"server 1")
    (suite / "sql" / "a.sql").write_text("SELECT 1;")
    (suite / "parallel_schedule").write_text("test: a b\n")
    key = stock_cache_key(bin_dir, suite, {"fsync": False})

    def run(statuses, returncode=0):
        return RegressRun(name="stock", outputdir=tmp_path, returncode=returncode, stdout="out", stderr="",
                          seconds=1.0, statuses=statuses)

    assert not keep_stock_run(key, run({"a": "ok", "b": "FAILED"}, 1), {}, ignored=set())
    assert not keep_stock_run(key, run({"a": "ok", "b": "ok"}, 2), {}, ignored=set())
    assert load_stock_run(key) is None
    assert keep_stock_run(key, run({"a": "ok", "b": "failed (ignored)"}), {"port": "1"}, ignored={"b"})
    kept, settings_seen = load_stock_run(key)
    assert kept.statuses == {"a": "ok", "b": "failed (ignored)"} and settings_seen == {"port": "1"}

    (suite / "sql" / "a.sql").write_text("SELECT 2;")
    changed_suite = stock_cache_key(bin_dir, suite, {"fsync": False})
    (bin_dir / "postgres").write_bytes(b"server 2")
    changed_server = stock_cache_key(bin_dir, suite, {"fsync": False})
    changed_settings = stock_cache_key(bin_dir, suite, {"fsync": True})
    assert len({key, changed_suite, changed_server, changed_settings}) == 4
    monkeypatch.setenv("STRATA_REGRESS_STOCK_CACHE", "none")
    assert load_stock_run(key) is None
