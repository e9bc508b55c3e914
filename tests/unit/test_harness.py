"""The MPI test harness turns a one-rank failure into a prompt failure of the whole job."""
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.spawn import clean_env, launched

ROOT = Path(__file__).resolve().parents[2]


def test_failure_on_one_rank_fails_the_job_instead_of_hanging():
    cmd = ["mpirun", "--bind-to", "none", "-np", "2", sys.executable, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "-o", "addopts=", str(ROOT / "tests" / "harness")]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    limit = 120
    start = time.monotonic()
    try:
        done = launched(cmd, timeout=limit, cwd=ROOT, env=clean_env())
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the harness let a one-rank failure hang for {limit}s") from None
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "deliberate failure on rank 1 only" in done.stdout + done.stderr
    assert "aborting the MPI job" in done.stdout + done.stderr
    assert elapsed < limit
