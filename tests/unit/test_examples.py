"""Unchanged Horovod scripts, with hvdsketch's compression as their one change, train under horovodrun."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spawn import clean_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["pytorch_horovod.py", "tensorflow_horovod.py"])
def test_dropin_script_trains_under_horovodrun(script):
    cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", sys.executable, str(ROOT / "examples" / script),
           "--steps", "20", "--compression", "sketch:error=0.5,density=0.05"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env=clean_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = re.search(r"loss ([\d.]+) -> ([\d.]+); sketch.*sent ([\d.]+) MB for ([\d.]+) MB", done.stdout)
    assert summary, done.stdout[-3000:]
    first, last, sent, dense = map(float, summary.groups())
    assert last < first  # it trains
    assert 0 < sent < 0.95 * dense  # its embedding sketched; its dense layers dense, never an overfilled sketch
