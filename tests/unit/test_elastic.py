"""Faults the way Horovod users meet them, with hvdsketch (error feedback on), in PyTorch and TensorFlow.

Horovod elastic on localhost (Gloo): two host names for this one machine,
``127.0.0.1`` with two slots and ``localhost`` with one, so the host Horovod
blacklists after a failure is the one-slot host only. A worker killed mid-training
leaves the job going on with two; a worker added joins it; either way the
survivors end with identical models and rank 0 logs that hvdsketch's per-rank
state was reset alike. Outside elastic, a rank killed mid-training ends the job
with a non-zero status promptly.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import needs
from tests.spawn import clean_env

pytestmark = needs.horovod
ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "elastic" / "worker.py"
LIMIT = 150
FRAMEWORKS = pytest.mark.parametrize("framework", ["torch", "tensorflow"])
#: The worker's options: each framework's loop, TensorFlow's steps as tf.function, and model.fit.
WORKERS = [["--framework", "torch"], ["--framework", "tensorflow"], ["--framework", "tensorflow", "--graph"],
           ["--framework", "tensorflow", "--fit"]]
#: A TensorFlow script whose one changed line is the tape: Horovod's own state object.
HOROVODS_STATE = ["--framework", "tensorflow", "--horovod-state"]


def run(cmd: list[str], cwd: Path, limit: float = LIMIT) -> tuple[int, str, float]:
    """Run ``cmd`` in a session of its own; on a timeout, kill that session (horovodrun does not
    always end on SIGTERM). Its status, its output and the seconds it took."""
    start = time.monotonic()
    child = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, env=clean_env(PYTHONPATH=str(ROOT), HOROVOD_GLOO_TIMEOUT_SECONDS="10",
                                                                   TF_CPP_MIN_LOG_LEVEL="3"))
    try:
        out, _ = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        raise AssertionError(f"{cmd[0]} ran past {limit} s:\n{out[-4000:]}") from None
    return child.returncode, out, time.monotonic() - start


def elastic(tmp_path: Path, worker: list[str], scenario: str, np_: int, hosts: str) -> str:
    (tmp_path / "hosts").write_text(hosts)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    discover.chmod(0o755)
    cmd = ["horovodrun", "--gloo", "--network-interface", "lo", "-np", str(np_), "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(discover), sys.executable, str(WORKER), *worker,
           "--scenario", scenario, "--out", str(tmp_path), "--hosts", str(tmp_path / "hosts")]
    status, out, _ = run(cmd, tmp_path)
    assert status == 0, out[-4000:]
    return out


def survivors(tmp_path: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]


def resets(ends: list[dict], text: str) -> list[int]:
    """The ranks that warned of a reset saying ``text``: rank 0 alone, of the world it began."""
    return [rank for rank, end in enumerate(ends) if any(text in message for message in end["resets"])]


@pytest.mark.parametrize("worker", WORKERS + [HOROVODS_STATE], ids=" ".join)
def test_a_worker_killed_mid_training_leaves_the_others_training_alike(tmp_path, worker):
    out = elastic(tmp_path, worker, "kill", 3, "127.0.0.1:2\nlocalhost:1\n")
    assert (tmp_path / "fault.done").exists()
    ends = survivors(tmp_path)
    assert [e["size"] for e in ends] == [2, 2], out[-3000:]
    assert len({e["digest"] for e in ends}) == 1 and {e["step"] for e in ends} == {30}
    assert resets(ends, "hvdsketch: the world changed (3 -> 2 ranks") == [0], out[-3000:]


@pytest.mark.parametrize("worker", WORKERS, ids=" ".join)
def test_a_worker_added_mid_training_joins_and_trains_alike(tmp_path, worker):
    out = elastic(tmp_path, worker, "add", 2, "127.0.0.1:2\n")
    ends = survivors(tmp_path)
    assert [e["size"] for e in ends] == [3, 3, 3], out[-3000:]
    assert len({e["digest"] for e in ends}) == 1
    assert resets(ends, "hvdsketch: the world changed (2 -> 3 ranks") == [0], out[-3000:]


@FRAMEWORKS
def test_a_rank_killed_outside_elastic_ends_the_job_non_zero_promptly(tmp_path, framework):
    cmd = ["mpirun", "--bind-to", "none", "-np", "2", sys.executable, str(WORKER), "--framework", framework,
           "--scenario", "die", "--out", str(tmp_path)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    status, out, _ = run(cmd, tmp_path, limit=60)  # raises past 60 s
    assert status != 0
    assert not list(tmp_path.glob("rank*.json")), out[-3000:]  # nobody finished
