"""Small MPI jobs for tests/unit/test_bad_input.py, whose outcome is a hang, a stall report or an
exit, so they run as a child ``mpirun -np 2 python -m tests.bad_input_jobs NAME`` under a timeout
rather than inside an MPI test session. Each prints ``rank R: ...`` lines the test reads."""
from __future__ import annotations

import os
import sys
import time


def stall() -> None:
    """Rank 0 starts its second step 7 s after rank 1, which waits in the exchanger meanwhile and
    reports what it waits for every ``HVDSKETCH_STALL_SECONDS``; then both finish the step."""
    import horovod.torch as hvd
    import torch

    from hvdsketch.torch import DistributedOptimizer

    hvd.init()
    layer = torch.nn.Linear(4, 2)
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters())
    for step in range(2):
        if step == 1 and hvd.rank() == 0:
            time.sleep(7)
        optimizer.zero_grad()
        layer(torch.ones(1, 4)).sum().backward()
        optimizer.step()
    print(f"rank {hvd.rank()}: done", flush=True)


def _tensorflow():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    return hvd, tf


def tf_dropin_mixed() -> None:
    """Horovod's own tape with the drop-in sketch on rank 0 and fp16 on rank 1."""
    hvd, tf = _tensorflow()
    from hvdsketch.tensorflow import Compression

    compression = Compression.sketch() if hvd.rank() == 0 else Compression.fp16
    var = tf.Variable(tf.ones((64, 4)))
    try:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * var)
        hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, [var])
        print(f"rank {hvd.rank()}: no error", flush=True)
    except Exception as err:  # what every rank should get: a clear error
        print(f"rank {hvd.rank()}: raised {type(err).__name__}: {err}", flush=True)


def tf_retrace_policy() -> None:
    """hvdsketch's tape inside tf.function, given a policy object, when only rank 1 traces again."""
    hvd, tf = _tensorflow()
    from hvdsketch.policy import create
    from hvdsketch.tensorflow import DistributedGradientTape

    policy = create("none")
    var = tf.Variable(tf.ones((8, 4)))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, var))
        return DistributedGradientTape(tape, compression=policy).gradient(loss, [var])[0]

    for i in range(3):
        step(tf.ones((5 if i == 2 and hvd.rank() == 1 else 6, 8)))
    print(f"rank {hvd.rank()}: done", flush=True)


if __name__ == "__main__":
    {"stall": stall, "tf_dropin_mixed": tf_dropin_mixed, "tf_retrace_policy": tf_retrace_policy}[sys.argv[1]]()
