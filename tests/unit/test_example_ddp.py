"""The plain DDP script, whose one change is hvdsketch's hook, trains under torchrun (2 ranks over
gloo, no Horovod) with dense, sketched and exact sparse exchanges of its sparse embedding."""
import re
import subprocess
import sys
from pathlib import Path

from tests.spawn import clean_env, launched

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["none", "sketch", "allgather", "union"]
SUMMARY = re.compile(r"^(\S+): loss ([\d.]+) -> ([\d.]+); sent ([\d.]+) MB for ([\d.]+) MB", re.MULTILINE)


def test_ddp_script_trains_under_torchrun_with_the_hook(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "pytorch_ddp.py"), "--steps", "20", "--checkpoint-dir", str(tmp_path),
           "--compression", *FLAGS]
    done = launched(cmd, timeout=300, cwd=tmp_path,
                          env=clean_env(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {flag: tuple(map(float, numbers)) for flag, *numbers in SUMMARY.findall(done.stdout)}
    assert set(runs) == set(FLAGS), done.stdout[-3000:]
    for flag, (first, last, sent, dense) in runs.items():
        assert last < first, flag  # it trains
        assert 0 < sent <= dense * (1.01 if flag == "none" else 0.55), flag  # and sends less but for none
    assert len(list(tmp_path.glob("ddp-*.pt"))) == len(FLAGS)  # rank 0 wrote its checkpoints


def test_the_hook_path_loads_no_horovod_mpi_or_lab():
    """``import hvdsketch.torch.ddp`` with torch alone: no Horovod, no mpi4py, nothing of the lab."""
    code = ("import sys, torch; before = set(sys.modules); import hvdsketch.torch.ddp, hvdsketch.collectives.torchdist; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "hvdsketch.torch.ddp" in loaded
    assert [m for m in loaded if m.startswith(("horovod", "mpi4py", "hvdsketch.lab", "yaml"))] == []
