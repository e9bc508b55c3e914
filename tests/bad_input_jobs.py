"""Small MPI jobs for tests/unit/test_bad_input.py, whose outcome is a hang, a stall report or an
exit, so they run as a child ``mpirun -np 2 python -m tests.bad_input_jobs NAME`` under a timeout
rather than inside an MPI test session. Each prints ``rank R: ...`` lines the test reads."""
from __future__ import annotations

import os
import sys
import time


def _torch_two_steps(sleeper: int, seconds: float) -> None:
    """Two steps of hvdsketch's optimizer where rank ``sleeper`` starts its second ``seconds`` late."""
    import horovod.torch as hvd
    import torch

    from hvdsketch.torch import DistributedOptimizer

    hvd.init()
    layer = torch.nn.Linear(4, 2)
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters())
    for step in range(2):
        if step == 1 and hvd.rank() == sleeper:
            time.sleep(seconds)
        optimizer.zero_grad()
        layer(torch.ones(1, 4)).sum().backward()
        optimizer.step()
    print(f"rank {hvd.rank()}: done", flush=True)


def stall() -> None:
    """Rank 0 starts its second step 7 s after rank 1, which waits in the exchanger meanwhile and
    reports what it waits for every ``HVDSKETCH_STALL_SECONDS``; then both finish the step."""
    _torch_two_steps(sleeper=0, seconds=7)


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


def outcome(rank: int, run) -> None:
    """Run ``run()`` and print this rank's outcome: ``done`` with the seconds it took, or the error."""
    began = time.monotonic()
    try:
        result = run()
        print(f"rank {rank}: done in {time.monotonic() - began:.1f} s: {result}", flush=True)
    except Exception as err:  # what every rank should get: a clear error
        text = " ".join(str(err).split())  # one line (TensorFlow's errors from inside tf.function take several)
        print(f"rank {rank}: raised {type(err).__name__} in {time.monotonic() - began:.1f} s: {text}", flush=True)


def _torch_step(change) -> None:
    """One step of hvdsketch's optimizer on a linear layer that ``change(layer, rank)`` alters on
    some ranks before the optimizer is made."""
    import horovod.torch as hvd
    import torch

    from hvdsketch.torch import DistributedOptimizer

    hvd.init()
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8)
    change(layer, hvd.rank())
    optimizer = DistributedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters())

    def step():
        layer(torch.ones(4, 16, dtype=layer.weight.dtype)).sum().backward()
        optimizer.step()
    outcome(hvd.rank(), step)


def torch_half() -> None:
    """Rank 1's model in float16 (``model.half()``), rank 0's in float32."""
    _torch_step(lambda layer, rank: layer.half() if rank == 1 else None)


def torch_double() -> None:
    """Rank 1's model in float64."""
    _torch_step(lambda layer, rank: layer.double() if rank == 1 else None)


def torch_frozen() -> None:
    """Rank 1's bias has ``requires_grad=False`` when the optimizer is made; rank 0's does not."""
    _torch_step(lambda layer, rank: layer.bias.requires_grad_(rank != 1))


def _tf_variables(tf, rank: int, dtype_on_rank_1: str = "float32"):
    dtype = dtype_on_rank_1 if rank == 1 else "float32"
    return tf.Variable(tf.ones((8, 4), dtype), name="w"), tf.Variable(tf.ones(4, dtype), name="b")


def tf_dtype() -> None:
    """hvdsketch's tape inside tf.function with rank 1's variables in float64."""
    hvd, tf = _tensorflow()
    from hvdsketch.tensorflow import DistributedGradientTape

    w, b = _tf_variables(tf, hvd.rank(), "float64")

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.ones((2, 8), w.dtype), w) + b)
        return DistributedGradientTape(tape).gradient(loss, [w, b])

    outcome(hvd.rank(), step)


def _tf_no_gradient(graph: bool) -> None:
    """hvdsketch's tape where ``b`` gets no gradient on rank 1 (its loss does not use it): every
    rank gets the average of rank 0's gradient and rank 1's zeros."""
    hvd, tf = _tensorflow()
    from hvdsketch.tensorflow import DistributedGradientTape

    w, b = _tf_variables(tf, hvd.rank())
    uses_b = hvd.rank() != 1

    def step():
        with tf.GradientTape() as tape:
            y = tf.matmul(tf.ones((2, 8)), w)
            loss = tf.reduce_sum(y + b if uses_b else y)
        return DistributedGradientTape(tape).gradient(loss, [w, b])

    run = tf.function(step) if graph else step
    outcome(hvd.rank(), lambda: [float(tf.reduce_sum(g)) for g in run()])


def tf_no_gradient_eager() -> None:
    _tf_no_gradient(graph=False)


def tf_no_gradient_graph() -> None:
    _tf_no_gradient(graph=True)


def tf_dropin_no_gradient() -> None:
    """Horovod's own tape with hvdsketch's drop-in compression inside tf.function, ``b`` without a
    gradient on rank 1: Horovod skips it there before the compression sees it. Rank 0 waits for ``b``
    (Horovod's stall inspector names it) while rank 1 goes on through 80 steps of 0.1 s; its end shuts
    Horovod down, and rank 0 raises."""
    hvd, tf = _tensorflow()
    from hvdsketch.tensorflow import Compression

    w, b = _tf_variables(tf, hvd.rank())
    uses_b = hvd.rank() != 1

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = tf.matmul(tf.ones((2, 8)), w)
            loss = tf.reduce_sum(y + b if uses_b else y)
        return hvd.DistributedGradientTape(tape, compression=Compression.fp16).gradient(loss, [w, b])

    def steps():
        for _ in range(80):
            float(tf.reduce_sum(step()[0]))
            time.sleep(0.1)
        return "80 steps"

    outcome(hvd.rank(), steps)


def torch_never_comes() -> None:
    """Rank 1 sleeps where rank 0 waits in hvdsketch's exchange: the stall limit ends the job."""
    _torch_two_steps(sleeper=1, seconds=300)


def train_differs() -> None:
    """``hvdsketch train`` with a YAML of its own on each rank: ``argv[2]`` is a line of rank 0's YAML
    and ``argv[3]`` of rank 1's (``path: hvdsketch`` / ``path: horovod``, ``lr: 0.1`` / ``lr: 0.2``)."""
    import tempfile

    from hvdsketch.lab.cli import build_parser

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, f"rank{rank}.yaml")
    with open(path, "w") as out:
        out.write(f"workload: {sys.argv[4]}\n{sys.argv[2 + rank]}\n")
    args = build_parser().parse_args(["train", "--config", path, "--steps-per-epoch", "2", "--out", folder])
    outcome(rank, lambda: args.run(args))


JOBS = {job.__name__: job for job in (stall, tf_dropin_mixed, tf_retrace_policy, torch_half, torch_double,
                                       torch_frozen, tf_dtype, tf_no_gradient_eager, tf_no_gradient_graph,
                                       tf_dropin_no_gradient, torch_never_comes, train_differs)}

if __name__ == "__main__":
    JOBS[sys.argv[1]]()
