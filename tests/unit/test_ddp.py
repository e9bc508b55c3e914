"""The DDP baselines: flags, the dense workload, and a dense DDP run matching hvdsketch's dense
training under horovodrun, record for record."""
import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from hvdsketch.lab.bench.ddp import add_arguments, dense_workload, parse_hook
from hvdsketch.spec import SpecError
from tests import needs
from tests.spawn import launched

ROOT = Path(__file__).resolve().parents[2]


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--config", "c.yaml", *argv])


def test_hook_flags():
    assert parse_hook(args()) == ("powersgd", 4, 2)
    assert parse_hook(args("--hook", "powersgd", "--rank", "2", "--start-iter", "5")) == ("powersgd", 2, 5)
    assert parse_hook(args("--hook", "powersgd:rank=8", "--rank", "2")) == ("powersgd", 8, 2)
    assert parse_hook(args("--hook", "none"))[0] == "none"
    assert parse_hook(args("--hook", "hvdsketch"))[0] == "hvdsketch"


@pytest.mark.parametrize("hook, message", [
    ("powersdg", "unknown hook 'powersdg'; valid: none, powersgd"),
    ("powersgd:ranks=2", r"unknown option\(s\) ranks for hook 'powersgd'; valid: rank, start_iter"),
    ("none:rank=2", r"unknown option\(s\) rank for hook 'none'"),
    ("hvdsketch:compression=auto", r"unknown option\(s\) compression for hook 'hvdsketch'"),
    ("powersgd:start_iter=1", "start_iter >= 2"),
    ("powersgd:rank=two", "are integers"),
])
def test_bad_hooks_raise_clear_errors(hook, message):
    with pytest.raises(SpecError, match=message):
        parse_hook(args("--hook", hook))


def test_dense_workload_turns_sparse_off():
    assert dense_workload("lstm:bptt=10,sparse=true") == "lstm:bptt=10,sparse=false"
    assert dense_workload("lstm") == "lstm:sparse=false"
    assert dense_workload("fashion:batch_size=8") == "fashion:batch_size=8"


def run(tmp_path: Path, name: str, command: list[str]) -> dict:
    out = tmp_path / name
    cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", sys.executable, "-m", *command, "--out", str(out)]
    done = launched(cmd, timeout=400, cwd=ROOT,
                          env={**os.environ, "HVDSKETCH_COMPRESSION": ""})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (record,) = out.glob("*.json")
    return json.loads(record.read_text())


@needs.horovod
def test_dense_ddp_trains_like_hvdsketch_dense(tmp_path):
    """Same workload, seed, data and steps: DDP's dense allreduce and hvdsketch's end at the same
    validation loss (to summation order), and write records with the same keys."""
    config = tmp_path / "c.yaml"
    config.write_text("workload: lstm:vocab_size=2000,batch_size=8,bptt=12,hidden=64,embed_dim=64,dropout=0\n"
                      "epochs: 1\nsteps_per_epoch: 4\nlr: 0.5\nclip: 0.5\n")
    ddp = run(tmp_path, "ddp", ["hvdsketch.lab.bench.ddp", "--config", str(config), "--hook", "none"])
    ours = run(tmp_path, "ours", ["hvdsketch.lab.cli", "train", "--config", str(config), "--compression", "none"])
    assert set(ddp) - {"ddp"} == set(ours)
    assert ddp["path"] == "ddp" and ddp["steps"] == ours["steps"] == 4 and ddp["exchange_s"] is None
    assert "sparse=False" in ddp["workload"] and "sparse=True" in ours["workload"]
    assert ddp["validation"][0]["loss"] == pytest.approx(ours["validation"][0]["loss"], rel=1e-5)
    assert ddp["bytes_sent_per_step"] == ddp["bytes_dense_per_step"] == ours["bytes_dense_per_step"]


@needs.horovod
def test_hvdsketch_hook_trains_like_hvdsketch_optimizer(tmp_path):
    """The baseline's ``--hook hvdsketch``: the config's compression through hvdsketch's DDP hook, the
    embedding's gradient sparse, ends where hvdsketch's optimizer with that compression ends and
    sends the bytes it sends."""
    config = tmp_path / "c.yaml"
    config.write_text("workload: lstm:vocab_size=2000,batch_size=8,bptt=12,hidden=64,embed_dim=64,dropout=0,"
                      "sparse=true\ncompression: allgather\nepochs: 1\nsteps_per_epoch: 4\nlr: 0.5\nclip: 0.5\n")
    hook = run(tmp_path, "hook", ["hvdsketch.lab.bench.ddp", "--config", str(config), "--hook", "hvdsketch"])
    ours = run(tmp_path, "ours", ["hvdsketch.lab.cli", "train", "--config", str(config)])
    assert hook["ddp"]["hook"] == "hvdsketch" and "sparse=True" in hook["workload"]
    assert hook["validation"][0]["loss"] == pytest.approx(ours["validation"][0]["loss"], rel=1e-5)
    assert hook["bytes_sent_per_step"] == pytest.approx(ours["bytes_sent_per_step"], rel=0.01)
    assert hook["bytes_sent_per_step"] < hook["bytes_dense_per_step"]  # the embedding sent as its rows
