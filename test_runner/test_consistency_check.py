"""The history checker (`fixtures/consistency.py`) on histories made by
hand, one per anomaly it must catch, and on histories of simulated
databases whose isolation is known: a serial one shows nothing, snapshot
isolation shows write skew (G2-item) and nothing worse, read committed
shows read skew (G-single). No cluster: these check the checker."""

from __future__ import annotations

import random

import pytest

from fixtures.consistency import (FAIL, INFO, OK, Op, check_bank, check_list_append, check_registers,
                                  load_history)


def op(process, invoke, complete, status, *mops, where="primary"):
    return Op(process, invoke, complete, status, list(mops), where)


def a(key, value):
    return ("append", key, value)


def r(key, seen):
    return ("r", key, seen)


def found(report) -> set[str]:
    return set(report.counts)


def test_a_clean_history_has_no_anomaly():
    h = [
        op(1, 0, 1, OK, a("x", 1), a("y", 1)),
        op(2, 2, 3, OK, r("x", [1]), a("x", 2)),
        op(3, 4, 5, OK, r("x", [1, 2]), r("y", [1])),
        op(1, 6, 7, FAIL, a("y", 9)),
        op(2, 8, 9, INFO, a("y", 3)),
        op(3, 10, 11, OK, r("y", [1, 3]), r("x", [1, 2])),
    ]
    report = check_list_append(h)
    assert found(report) == set(), report.anomalies
    assert report.stats["edges"] >= 4, report.stats


@pytest.mark.parametrize("name,history", [
    # Two transactions each append to x and y, in opposite orders.
    ("G0", [op(1, 0, 2, OK, a("x", 1), a("y", 2)),
            op(2, 0, 2, OK, a("x", 2), a("y", 1)),
            op(3, 3, 4, OK, r("x", [1, 2]), r("y", [1, 2]))]),
    # Each reads the other's append: information flows both ways.
    ("G1c", [op(1, 0, 2, OK, a("x", 1), r("y", [1])),
             op(2, 0, 2, OK, a("y", 1), r("x", [1]))]),
    # Read skew: T3 reads x before T1's append (rw to T1) and y after T2's
    # (wr from T2), while T2 appended to z after T1 (ww): one rw edge.
    ("G-single", [op(1, 0, 1, OK, a("x", 1), a("z", 1)),
                  op(2, 0, 1, OK, a("z", 2), a("y", 1)),
                  op(3, 0, 2, OK, r("x", []), r("y", [1])),
                  op(4, 3, 4, OK, r("z", [1, 2]), r("x", [1]))]),
    # Write skew: each reads the key the other appends to, before it did.
    ("G2-item", [op(1, 0, 2, OK, r("x", []), a("y", 1)),
                 op(2, 0, 2, OK, r("y", []), a("x", 1)),
                 op(3, 3, 4, OK, r("x", [1]), r("y", [1]))]),
    ("G1a", [op(1, 0, 1, FAIL, a("x", 1)),
             op(2, 2, 3, OK, r("x", [1]))]),
    ("G1b", [op(1, 0, 3, OK, a("x", 1), a("x", 2)),
             op(2, 1, 2, OK, r("x", [1]))]),
    ("lost", [op(1, 0, 1, OK, a("x", 1)),
              op(1, 2, 3, OK, a("x", 2)),
              op(2, 4, 5, OK, r("x", [1]))]),
    ("stale", [op(1, 0, 1, OK, a("x", 1)),
               op(2, 2, 3, OK, r("x", [])),
               op(2, 4, 5, OK, r("x", [1]))]),
    ("incompatible-order", [op(1, 0, 1, OK, a("x", 1)),
                            op(2, 0, 1, OK, a("x", 2)),
                            op(3, 2, 3, OK, r("x", [1, 2])),
                            op(4, 2, 3, OK, r("x", [2, 1]))]),
    ("duplicate", [op(1, 0, 1, OK, a("x", 1)),
                   op(2, 2, 3, OK, r("x", [1, 1]))]),
    ("garbage", [op(1, 0, 1, OK, a("x", 1)),
                 op(2, 2, 3, OK, r("x", [1, 7]))]),
    ("internal", [op(1, 0, 1, OK, a("x", 1)),
                  op(2, 2, 3, OK, a("x", 2), r("x", [1]))]),
    ("non-monotonic", [op(1, 0, 1, OK, a("x", 1)),
                       op(2, 2, 3, OK, r("x", [1]), where="replica"),
                       op(2, 4, 5, OK, r("x", []), where="replica")]),
])
def test_each_anomaly_is_caught(name, history):
    report = check_list_append(history)
    assert name in report.counts, f"{name} not found; found {report.summary()}: {report.anomalies}"
    others = found(report) - {name, "stale", "lost", "non-monotonic", "incompatible-order"}
    # A cycle is reported once, by its most severe class.
    assert not others & {"G0", "G1c", "G-single", "G2-item"} - {name}, report.anomalies


def test_isolation_levels_forbid_what_they_promise():
    skew = check_list_append([op(1, 0, 2, OK, r("x", []), a("y", 1)),
                              op(2, 0, 2, OK, r("y", []), a("x", 1)),
                              op(3, 3, 4, OK, r("x", [1]), r("y", [1]))])
    assert skew.forbidden("serializable") and not skew.forbidden("repeatable read")
    assert not skew.forbidden("read committed")
    # What stock PostgreSQL shows too is set apart, and only that.
    assert skew.known("serializable") == skew.forbidden("serializable") and not skew.unexpected("serializable")
    lost = check_list_append([op(1, 0, 1, OK, a("x", 1)), op(2, 2, 3, OK, r("x", []))])
    assert set(lost.unexpected("serializable")) == {"lost"} and not lost.known("serializable")


def test_replica_reads_are_not_held_to_real_time():
    h = [op(1, 0, 1, OK, a("x", 1)),
         op(2, 2, 3, OK, r("x", []), where="replica"),
         op(2, 4, 5, OK, r("x", [1]), where="replica")]
    assert found(check_list_append(h)) == set()
    h[1].where = h[2].where = "primary"
    assert found(check_list_append(h)) == {"stale"}


def test_bank_totals_and_negative_balances():
    good = [op(1, 0, 1, OK, ("transfer", None, {"from": 0, "to": 1, "amount": 5})),
            op(2, 2, 3, OK, ("read", None, {0: 95, 1: 105}))]
    assert found(check_bank(good, 200)) == set()
    bad = [op(2, 2, 3, OK, ("read", None, {0: 95, 1: 100})),
           op(2, 4, 5, OK, ("read", None, {0: -5, 1: 205})),
           op(2, 6, 7, FAIL, ("read", None, {0: 0, 1: 0}))]
    assert check_bank(bad, 200).counts == {"bank-total": 1, "bank-negative": 1}


def test_registers_read_your_writes_and_monotonic_reads():
    good = [op(1, 0, 1, OK, ("w", "k", 1)),
            op(1, 2, 3, OK, ("r", "k", 1), where="replica"),
            op(2, 2, 3, OK, ("r", "k", None), where="replica"),
            op(2, 4, 5, OK, ("r", "k", 1), where="replica")]
    assert found(check_registers(good)) == set()
    bad = [op(1, 0, 1, OK, ("w", "k", 1)),
           op(1, 2, 3, OK, ("w", "k", 2)),
           op(1, 4, 5, OK, ("r", "k", 1), where="replica"),
           op(2, 4, 5, OK, ("r", "k", 2), where="replica"),
           op(2, 6, 7, OK, ("r", "k", 1), where="replica"),
           op(3, 6, 7, OK, ("r", "k", 9), where="replica")]
    assert check_registers(bad).counts == {"read-your-writes": 1, "non-monotonic": 1, "garbage": 1}


# ------------------------------------------------- simulated databases

class Simulated:
    """An in-memory list-append database: `serial` runs one transaction at
    a time; `si` gives each a snapshot and aborts the second of two that
    append to the same key (first committer wins); `rc` reads the latest
    committed state at each read."""

    def __init__(self, mode: str, rng: random.Random):
        self.mode, self.rng = mode, rng
        self.committed: dict[str, list[int]] = {}
        self.version = 0
        self.commits: list[tuple[int, set[str]]] = []  # (version, keys written)
        self.next_value = 0

    def txn(self, keys: list[str]) -> list[tuple]:
        mops = []
        for _ in range(self.rng.randint(1, 4)):
            k = self.rng.choice(keys)
            if self.rng.random() < 0.5:
                self.next_value += 1
                mops.append(("append", k, self.next_value))
            else:
                mops.append(("r", k, None))
        return mops

    def run(self, n: int, clients: int = 4) -> list[Op]:
        keys = [f"k{i}" for i in range(6)]
        history, live, clock = [], [], 0.0
        while len(history) < n or live:
            clock += 1
            if len(live) < clients and len(history) + len(live) < n:
                snap = {k: list(v) for k, v in self.committed.items()}
                idle = min(set(range(clients)) - {t["process"] for t in live})
                live.append({"mops": self.txn(keys), "snap": snap, "at": self.version, "step": 0,
                             "writes": {}, "invoke": clock, "process": idle})
                if self.mode != "serial":
                    continue
            t = live[0] if self.mode == "serial" else self.rng.choice(live)
            if t["step"] < len(t["mops"]):
                kind, k, v = t["mops"][t["step"]]
                if kind == "append":
                    t["writes"].setdefault(k, []).append(v)
                else:
                    base = t["snap"] if self.mode == "si" else self.committed
                    t["mops"][t["step"]] = ("r", k, list(base.get(k, [])) + t["writes"].get(k, []))
                t["step"] += 1
                continue
            live.remove(t)
            conflict = self.mode == "si" and any(
                ver > t["at"] and keys_w & set(t["writes"]) for ver, keys_w in self.commits)
            if conflict:
                history.append(Op(t["process"], t["invoke"], clock, FAIL, t["mops"]))
                continue
            for k, vs in t["writes"].items():
                self.committed.setdefault(k, []).extend(vs)
            self.version += 1
            self.commits.append((self.version, set(t["writes"])))
            history.append(Op(t["process"], t["invoke"], clock, OK, t["mops"]))
        final = Op(99, clock + 1, clock + 2, OK, [("r", k, list(self.committed.get(k, []))) for k in keys])
        return history + [final]


def test_a_serial_database_shows_nothing():
    for seed in range(20):
        report = check_list_append(Simulated("serial", random.Random(seed)).run(200))
        assert found(report) == set(), (seed, report.anomalies)


@pytest.mark.parametrize("mode,level,shown", [
    ("si", "repeatable read", "G2-item"),  # write skew, and nothing worse
    ("rc", "read committed", "G-single"),  # read skew, and nothing worse
])
def test_a_weaker_database_shows_what_its_level_allows_and_nothing_worse(mode, level, shown):
    kinds = set()
    for seed in range(30):
        report = check_list_append(Simulated(mode, random.Random(seed)).run(200), realtime=False)
        assert not report.forbidden(level), (seed, report.anomalies)
        kinds |= found(report)
    assert shown in kinds, kinds


def test_histories_round_trip_through_files(tmp_path):
    h = Simulated("si", random.Random(1)).run(50)
    path = tmp_path / "history.jsonl"
    path.write_text("".join(o.to_json() + "\n" for o in h))
    again = load_history(path)
    assert [(o.process, o.status, o.mops) for o in again] == [(o.process, o.status, o.mops) for o in h]
    assert check_list_append(again, realtime=False).counts == check_list_append(h, realtime=False).counts
