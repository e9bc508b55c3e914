"""A Horovod training script with hvdsketch's optimizer, for the fault tests (tests/unit/test_elastic.py).

``--scenario kill``: inside ``hvd.elastic.run`` with ``hvd.elastic.TorchState``, the
worker on host ``localhost`` (the discovery script's one-slot host) exits at
step ``--at`` on its first launch (a marker file says it did); the others go on.
``--scenario add``: rank 0 adds host ``localhost`` to the discovery file at step
``--at``; training goes on until the new worker has joined. ``--scenario die``:
no elastic (plain ``mpirun``/``horovodrun``); rank 1 kills itself at step
``--at``. At the end every rank writes ``rank{r}.json`` into ``--out``: the
world's size, the step and a digest of its parameters.
"""
import argparse
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import torch

import horovod.torch as hvd
import hvdsketch.torch as hvdsketch_torch

parser = argparse.ArgumentParser()
parser.add_argument("--scenario", choices=["kill", "add", "die"], required=True)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--hosts", type=Path, help="the discovery script's file (add)")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--at", type=int, default=8)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = hvdsketch_torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                                 model.named_parameters(), compression="topk:ratio=0.2",
                                                 memory="fp32")


def one_step(step: int) -> None:
    rng = np.random.default_rng([hvd.rank(), step])
    x = torch.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 4, size=8))
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def fault(step: int) -> None:
    if step != args.at:
        return
    marker = args.out / "fault.done"
    if args.scenario == "kill" and os.environ.get("HOROVOD_HOSTNAME") == "localhost" and not marker.exists():
        marker.touch()
        os._exit(1)
    if args.scenario == "add" and hvd.rank() == 0 and not marker.exists():
        marker.touch()
        args.hosts.write_text("127.0.0.1:2\nlocalhost:1\n")
    if args.scenario == "die" and hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def going_on(state) -> bool:
    """The same verdict on every rank: the steps asked for, and (add) until the new worker is in."""
    if state.step < args.steps:
        return True
    return args.scenario == "add" and hvd.size() < 3 and state.step < 50 * args.steps


@hvd.elastic.run
def train(state) -> None:
    while going_on(state):
        fault(state.step)
        one_step(state.step)
        state.step += 1
        state.commit()
        time.sleep(0.01)


def report(step: int) -> None:
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    (args.out / f"rank{hvd.rank()}.json").write_text(json.dumps({"size": hvd.size(), "step": step,
                                                                 "digest": digest}))


if args.scenario == "die":
    for step in range(args.steps):
        fault(step)
        one_step(step)
    report(args.steps)
else:
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    train(state)
    report(state.step)
