"""launch/cluster.sh: ranks run on the shaped loopback, and the namespace never outlives the script.

(Whether shaping limits throughput is measured, not asserted: see
``hvdsketch bench collectives`` under cluster.sh.)
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "cluster.sh"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="cluster.sh needs root, ip and tc")


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def cluster(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_every_rank_runs_behind_the_shaped_loopback_and_the_namespace_goes_away():
    done = cluster("--rate", "200mbit", "-np", "2", "--", "sh", "-c", "tc qdisc show dev lo; ip -o link | wc -l")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert done.stdout.count("rate 200Mbit") == 2  # one line per rank
    assert lines.count("1") == 2  # only the loopback: no route to the host's interfaces
    name = done.stderr.split("netns ")[1].split(",")[0]
    assert name.startswith("hvdsketch-") and name not in namespaces()


def test_a_failing_command_keeps_its_exit_status_and_cleans_up():
    done = cluster("-np", "2", "--", "python", "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    name = done.stderr.split("netns ")[1].split(",")[0]
    assert name not in namespaces()


@pytest.mark.parametrize("args, message", [
    (["--rate", "fast", "--", "true"], "tc rejected rate 'fast'"),
    (["-np", "two", "--", "true"], "-np must be a positive integer"),
    (["--rate", "1gbit"], "no command given"),
    (["--ranks", "2", "--", "true"], "unknown option --ranks"),
])
def test_bad_options_are_clear_errors(args, message):
    done = cluster(*args)
    assert done.returncode == 2 and message in done.stderr


def test_sigterm_stops_the_ranks_and_removes_the_namespace():
    proc = subprocess.Popen([str(SCRIPT), "-np", "2", "--", "sleep", "60"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    name = f"hvdsketch-{proc.pid}"
    deadline = time.monotonic() + 60
    while name not in namespaces() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert name in namespaces()
    time.sleep(3)  # let mpirun start its ranks
    inside = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    assert len(inside) >= 3  # mpirun and two ranks
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert name not in namespaces()
    assert not [pid for pid in inside if alive(pid)]


def alive(pid: str) -> bool:
    """Running, not a zombie waiting to be reaped by init."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
