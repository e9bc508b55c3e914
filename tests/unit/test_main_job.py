"""The main job (``bash launch/run.sh``), short: its output carries no warning from PyTorch or
TensorFlow (nothing a user cannot act on), shows auto's per-tensor choices, compares auto with dense
on the loopback and, where launch/cluster.sh can run, over 1 Gbit/s links, and ends with one line
of both speed-ups; where the emulated cluster cannot run, that line says why and how to see them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.spawn import clean_env, launched

ROOT = Path(__file__).resolve().parents[2]
#: what PyTorch's and Python's warnings, TensorFlow's C++ log (E0000/W0000 ...) and its Python log print
WARNING = re.compile(r"Warning|WARNING|^[EWF]\d{4} |Unable to register|absl::InitializeLog", re.MULTILINE)
#: one comparison, as `hvdsketch compare` prints it, labelled with its network
SUMMARY = (r"^== lstm, 2 ranks, auto against dense on {where}: step ([\d.]+) vs ([\d.]+) ms \(([\d.]+)x faster\), "
           r"([\d.]+) vs ([\d.]+) MB a step \(([\d.]+)x fewer bytes\)$")
LOOPBACK = re.compile(SUMMARY.format(where="the loopback"), re.MULTILINE)
LINKS = re.compile(SUMMARY.format(where="1 Gbit/s links"), re.MULTILINE)
BOTH = re.compile(r"^== lstm, 2 ranks, auto against dense: ([\d.]+)x faster on the loopback, ([\d.]+)x on 1 Gbit/s links$")
NOT_RUN = re.compile(r"^== lstm, 2 ranks, auto against dense: ([\d.]+)x faster on the loopback; not run on 1 Gbit/s "
                     r"links \((.+)\): bash launch/run.sh as root where network namespaces are allowed runs them; "
                     r"results/README.md has such links' figures$")
CLUSTER = os.geteuid() == 0 and all(shutil.which(tool) for tool in ("ip", "tc", "unshare"))


def main_job(out: Path, **env: str) -> subprocess.CompletedProcess:
    workload = yaml.safe_load((ROOT / "configs" / "lstm.yaml").read_text())["workload"]
    cmd = ["bash", "launch/run.sh", "--epochs", "1", "--steps-per-epoch", "6",
           "--workload", f"{workload},val_limit=300"]  # validation on fewer words: a short run
    done = launched(cmd, cwd=ROOT, timeout=1140,
                          env=clean_env(DENSE_STEPS="4", OUT=str(out), **env))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert not WARNING.findall(output), [line for line in output.splitlines() if WARNING.search(line)]
    assert "hvdsketch auto: 2 ranks" in output and "embedding.weight" in output  # its per-tensor table
    return done


def check(summary: re.Match) -> float:
    """A comparison's bytes: fewer than dense's, their ratio as printed; its speed-up."""
    sent, dense = float(summary[4]), float(summary[5])
    assert 0 < sent < dense and float(summary[6]) == pytest.approx(dense / sent, rel=0.01)
    return float(summary[3])


@pytest.mark.skipif(not CLUSTER, reason="the links' runs need root, ip, tc and unshare (launch/cluster.sh)")
@pytest.mark.timeout(1200)
def test_the_main_job_is_clean_and_ends_with_auto_against_dense_on_the_loopback_and_on_links(tmp_path):
    done = main_job(tmp_path)
    lines = done.stdout.strip().splitlines()
    both, links, loopback = BOTH.match(lines[-1]), LINKS.match(lines[-2]), LOOPBACK.search(done.stdout)
    assert both and links and loopback, done.stdout[-2000:]
    assert float(both[1]) == check(loopback) and float(both[2]) == check(links)


@pytest.mark.timeout(1200)
def test_where_the_cluster_cannot_run_the_last_line_says_why_and_how_to_see_the_links(tmp_path):
    """An `ip` that may not make namespaces (as in a container without the right) stands in for a
    machine where launch/cluster.sh cannot run: the loopback's comparison, then why."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "ip").write_text('#!/bin/sh\necho "mount --make-shared /run/netns failed: Operation not permitted" >&2\n'
                             "exit 1\n")
    (shim / "ip").chmod(0o755)
    done = main_job(tmp_path / "out", PATH=f"{shim}:{os.environ['PATH']}")
    lines = done.stdout.strip().splitlines()
    not_run = NOT_RUN.match(lines[-1])
    assert not_run, done.stdout[-2000:]
    assert "Operation not permitted" in not_run[2]
    assert float(not_run[1]) == check(LOOPBACK.match(lines[-2]))
    assert not (tmp_path / "out" / "links").exists()
