"""The main job (``bash launch/run.sh``), short: its output carries no warning from PyTorch or
TensorFlow (nothing a user cannot act on), shows auto's per-tensor choices, and ends with one line
of auto's step time and bytes against dense."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.spawn import clean_env

ROOT = Path(__file__).resolve().parents[2]
#: what PyTorch's and Python's warnings, TensorFlow's C++ log (E0000/W0000 ...) and its Python log print
WARNING = re.compile(r"Warning|WARNING|^[EWF]\d{4} |Unable to register|absl::InitializeLog", re.MULTILINE)
SUMMARY = re.compile(r"^== lstm, 2 ranks, auto against dense: step ([\d.]+) vs ([\d.]+) ms \(([\d.]+)x faster\), "
                     r"([\d.]+) vs ([\d.]+) MB a step \(([\d.]+)x fewer bytes\)$")


@pytest.mark.timeout(900)
def test_the_main_job_is_clean_and_ends_with_auto_against_dense(tmp_path):
    workload = yaml.safe_load((ROOT / "configs" / "lstm.yaml").read_text())["workload"]
    cmd = ["bash", "launch/run.sh", "--epochs", "1", "--steps-per-epoch", "6",
           "--workload", f"{workload},val_limit=300"]  # validation on fewer words: a short run
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840,
                          env=clean_env(DENSE_STEPS="4", OUT=str(tmp_path)))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert not WARNING.findall(output), [line for line in output.splitlines() if WARNING.search(line)]
    assert "hvdsketch auto: 2 ranks" in output and "embedding.weight" in output  # its per-tensor table
    summary = SUMMARY.match(done.stdout.strip().splitlines()[-1])
    assert summary, done.stdout[-2000:]
    sent, dense = float(summary[4]), float(summary[5])
    assert 0 < sent < dense and float(summary[6]) == pytest.approx(dense / sent, rel=0.01)
