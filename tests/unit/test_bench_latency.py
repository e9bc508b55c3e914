"""``hvdsketch bench latency``: every case timed over gloo and MPI at 2 ranks, rank 0 the only one
printing; bad counts a clear error."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spawn import clean_env, launched

ROOT = Path(__file__).resolve().parents[2]
CASES = ["MPI Allreduce, 8 int64", "gloo all_reduce, 8 int64", "gloo all_gather, 8 int64",
         "gloo isend/irecv, 8 int64", "MPI Allgather, 364 KB", "gloo all_gather, 364 KB", "gloo isend/irecv, 364 KB"]
LINE = re.compile(r"^(.+?)\s+(\d+) us \((\d+)\.\.(\d+)\); single calls: median (\d+), 90th percentile (\d+) us$")


def latency(*options: str) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "--bind-to", "none", "-np", "2", sys.executable, "-m", "hvdsketch.lab.cli", "bench", "latency",
           *options]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return launched(cmd, cwd=ROOT, timeout=240,
                          env=clean_env(PYTHONPATH=str(ROOT), OMPI_MCA_rmaps_base_oversubscribe="1"))


@pytest.mark.timeout(300)
def test_every_case_is_timed_and_printed_once():
    done = latency("--batches", "2", "--calls", "3", "--warmup", "1")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    lines = [LINE.match(line) for line in done.stdout.splitlines() if "single calls" in line]
    assert [m.group(1) for m in lines if m] == CASES  # rank 0 alone prints, each case once, in order
    for m in lines:
        median, low, high = (int(m.group(i)) for i in (2, 3, 4))
        assert low <= median <= high


@pytest.mark.timeout(300)
def test_bad_counts_are_a_clear_error():
    done = latency("--calls", "0")
    assert done.returncode != 0
    assert "--batches and --calls must be >= 1" in done.stdout + done.stderr
