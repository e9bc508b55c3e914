"""A Horovod training script with hvdsketch (error feedback on), for the fault tests (tests/unit/test_elastic.py).

``--framework torch``: hvdsketch's ``DistributedOptimizer`` in ``hvd.elastic.TorchState``;
``--framework tensorflow``: hvdsketch's ``DistributedGradientTape`` in an eager loop, in
``hvdsketch.tensorflow.elastic.TensorFlowKerasState``; with ``--graph`` each step a
``tf.function``; with ``--fit`` each step a ``model.fit`` of one batch with hvdsketch's tf-keras
``DistributedOptimizer``, in ``hvdsketch.tensorflow.elastic.KerasState``; with ``--horovod-state``
in Horovod's own ``TensorFlowKerasState`` (a script whose one changed line is the tape). Always
under Horovod's own ``hvd.elastic.run``.

``--scenario kill``: inside ``hvd.elastic.run``, the worker on host ``localhost`` (the
discovery script's one-slot host) exits at step ``--at`` on its first launch (a marker
file says it did); the others go on. ``--scenario add``: rank 0 adds host ``localhost``
to the discovery file at step ``--at``; training goes on until the new worker has
trained a few steps with the others. ``--scenario die``: no elastic (plain
``mpirun``/``horovodrun``); rank 1 kills itself at step ``--at``. At the end every rank writes ``rank{r}.json`` into ``--out``:
the world's size, the step, a digest of its parameters and the ``StateReset`` warnings it
gave (read there, not in horovodrun's output, whose ranks' lines may interleave).
"""
import argparse
import hashlib
import json
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--framework", choices=["torch", "tensorflow"], default="torch")
parser.add_argument("--scenario", choices=["kill", "add", "die"], required=True)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--hosts", type=Path, help="the discovery script's file (add)")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--at", type=int, default=8)
parser.add_argument("--graph", action="store_true", help="TensorFlow: each step a tf.function")
parser.add_argument("--fit", action="store_true", help="TensorFlow: each step model.fit, the keras optimizer")
parser.add_argument("--horovod-state", action="store_true", help="TensorFlow: Horovod's TensorFlowKerasState")
args = parser.parse_args()
COMPRESSION, MEMORY = "topk:ratio=0.2", "fp32"
resets: list[str] = []  # the StateReset warnings this rank gave


def keep_resets() -> None:
    from hvdsketch.exchange.checkpoint import StateReset

    show = warnings.showwarning

    def showwarning(message, category, *args, **kwargs) -> None:
        if issubclass(category, StateReset):
            resets.append(str(message))
        show(message, category, *args, **kwargs)

    warnings.simplefilter("always", StateReset)
    warnings.showwarning = showwarning


@dataclass
class Job:
    hvd: Any
    one_step: Callable[[int], None]
    parameters: Callable[[], bytes]
    new_state: Callable[[], Any]


def batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([rank, step])
    return rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 4, size=8)


def torch_job() -> Job:
    import torch

    import horovod.torch as hvd
    import hvdsketch.torch as hvdsketch_torch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = hvdsketch_torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                                     model.named_parameters(), compression=COMPRESSION, memory=MEMORY)

    def one_step(step: int) -> None:
        x, y = (torch.from_numpy(a) for a in batch(hvd.rank(), step))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return Job(hvd, one_step, lambda: b"".join(p.detach().numpy().tobytes() for p in model.parameters()),
               lambda: hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0))


def tensorflow_job() -> Job:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    import horovod.tensorflow as hvd
    import hvdsketch.tensorflow as hvdsketch_tf

    hvd.init()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    if args.fit:
        optimizer = hvdsketch_tf.keras.DistributedOptimizer(optimizer, compression=COMPRESSION, memory=MEMORY)
        model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    optimizer.build(model.trainable_variables)  # its variables exist for the state to keep
    if args.fit:
        return Job(hvd, lambda step: model.fit(*batch(hvd.rank(), step), batch_size=8, verbose=0),
                   lambda: b"".join(v.numpy().tobytes() for v in model.trainable_variables),
                   lambda: hvdsketch_tf.elastic.KerasState(model, step=0))

    def train_step(x, y) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
        tape = hvdsketch_tf.DistributedGradientTape(tape, compression=COMPRESSION, memory=MEMORY)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    compiled = tf.function(train_step) if args.graph else train_step
    return Job(hvd, lambda step: compiled(*batch(hvd.rank(), step)),
               lambda: b"".join(v.numpy().tobytes() for v in model.trainable_variables),
               lambda: (hvd.elastic if args.horovod_state else hvdsketch_tf.elastic).TensorFlowKerasState(
                   model, optimizer, step=0))


job = torch_job() if args.framework == "torch" else tensorflow_job()
hvd = job.hvd
keep_resets()


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


#: add: the step at which this rank first trained in a world of three (the same on every rank: the
#: old workers' step at the reset, which the sync gives the new one).
joined_at: int | None = None
#: add: the steps trained in the world of three, so that its exchanges join (the host may be
#: discovered after the steps asked for, when the old workers' next commit is the reset).
STEPS_JOINED = 3


def going_on(state) -> bool:
    """The same verdict on every rank: the steps asked for, and (add) until the new worker has trained
    ``STEPS_JOINED`` steps with the others."""
    global joined_at
    if args.scenario == "add" and hvd.size() == 3 and joined_at is None:
        joined_at = state.step
    if args.scenario != "add":
        return state.step < args.steps
    if joined_at is None:
        return state.step < 50 * args.steps
    return state.step < max(args.steps, joined_at + STEPS_JOINED)


@hvd.elastic.run
def train(state) -> None:
    while going_on(state):
        fault(state.step)
        job.one_step(state.step)
        state.step += 1
        state.commit()
        time.sleep(0.01)


def report(step: int) -> None:
    digest = hashlib.sha256(job.parameters()).hexdigest()
    (args.out / f"rank{hvd.rank()}.json").write_text(json.dumps({"size": hvd.size(), "step": step,
                                                                 "digest": digest, "resets": resets}))


if args.scenario == "die":
    for step in range(args.steps):
        fault(step)
        job.one_step(step)
    report(args.steps)
else:
    state = job.new_state()
    train(state)
    report(state.step)
