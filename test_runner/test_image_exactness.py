"""Image decoding is exact: with wal_consistency_checking='all' every block
change carries a full-page image, so after a CHECKPOINT and a clean shutdown
the last image of each block in the WAL must equal the block in the data
files, up to what PostgreSQL itself tolerates (hint bits, pd_lsn, unused
space; see `strata wal verify-images`)."""

import json
import subprocess

import pytest

from fixtures.workload import broad_settings, run_broad_workload


@pytest.mark.parametrize("compression", ["off", "pglz", "lz4", "zstd"])
def test_last_images_equal_data_files(pg_cluster, strata_bin, compression):
    pg_cluster.initdb()
    pg_cluster.start(broad_settings("all", compression))
    run_broad_workload(pg_cluster)
    pg_cluster.stop("fast")

    res = subprocess.run([strata_bin, "wal", "verify-images", "--pgdata", pg_cluster.pgdata],
                         capture_output=True, text=True, timeout=600)
    assert res.stdout, res.stderr
    report = json.loads(res.stdout)
    assert res.returncode == 0, json.dumps(report["mismatches"], indent=1) + res.stderr
    assert report["blocks_mismatched"] == 0
    # The workload touches thousands of blocks; most are still on disk.
    assert report["images"] > 10_000, report
    assert report["blocks_compared"] > 1_000, report
    assert report["blocks_equal"] == report["blocks_compared"]
