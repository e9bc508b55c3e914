"""The plain FSDP2 script, whose one change is hvdsketch's compress(), trains under torchrun (2 ranks
over gloo, no Horovod) with every reduce-scatter method, and writes a distributed checkpoint each."""
import re
import subprocess
import sys
from pathlib import Path

from tests.spawn import clean_env, launched

ROOT = Path(__file__).resolve().parents[2]
#: Each method, and how much of FSDP's own reduce-scatter's bytes it may send at most.
FLAGS = {"none": 1.0, "fp16:dtype=bfloat16": 0.51, "quantize": 0.3, "rows": 1.0}
SUMMARY = re.compile(r"^(\S+): loss ([\d.]+) -> ([\d.]+); sent ([\d.]+) MB for ([\d.]+) MB", re.MULTILINE)


def test_fsdp_script_trains_under_torchrun_with_every_method(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "fsdp_lm.py"), "--steps", "30", "--checkpoint-dir", str(tmp_path),
           "--compression", *FLAGS]
    done = launched(cmd, timeout=400, cwd=tmp_path,
                          env=clean_env(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {flag: tuple(map(float, numbers)) for flag, *numbers in SUMMARY.findall(done.stdout)}
    assert set(runs) == set(FLAGS), done.stdout[-3000:]
    for flag, (first, last, sent, dense) in runs.items():
        assert last < first - 0.5, flag  # it trains
        assert 0 < sent <= dense * FLAGS[flag] * 1.01, flag
    assert len(list(tmp_path.glob("fsdp-*/.metadata"))) == len(FLAGS)  # every rank wrote its shards


def test_the_fsdp_front_end_loads_no_horovod_mpi_or_lab():
    """``import hvdsketch.torch.fsdp`` with torch alone: no Horovod, no mpi4py, nothing of the lab."""
    code = ("import sys, torch; before = set(sys.modules); import hvdsketch.torch.fsdp; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "hvdsketch.torch.fsdp.reduction" in loaded
    assert [m for m in loaded if m.startswith(("horovod", "mpi4py", "hvdsketch.lab", "yaml"))] == []
