"""The TensorFlow (tf-keras) training loop of ``hvdsketch train``: one ``tf.function`` step.

With ``memory`` too: the tape holds ``fp32`` residuals in variables the graph updates, and runs
what else needs Python each step in Python ops inside the function.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from tqdm import tqdm

from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.spec import SpecError
from hvdsketch.lab.config import TrainConfig, agree, environment


def train(config: TrainConfig, workload: Any) -> dict[str, Any]:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import horovod.tensorflow as hvd
    import tensorflow as tf
    import tf_keras as keras

    hvd.init()
    agree(config, hvd)
    rank, size = hvd.rank(), hvd.size()
    model = workload.build_model()
    optimizer = (keras.optimizers.Adam(config.lr) if config.optimizer == "adam"
                 else keras.optimizers.SGD(config.lr, momentum=config.momentum))
    hvd.broadcast_variables(model.variables, root_rank=0)

    if config.collectives != "horovod":
        raise SpecError("collectives: mpi trains PyTorch workloads only (hvdsketch.torch.DistributedOptimizer)")
    tapes: list[Any] = []  # hvdsketch's path: the tapes made (one per trace of the step)
    if config.path == "local":  # each rank alone: no exchange
        def gradients(tape, loss):
            return tape.gradient(loss, model.trainable_variables)

        def report() -> tuple[int, int]:
            return 0, 0
    elif config.path == "horovod":
        from hvdsketch.tensorflow import Compression

        if not config.densify:
            raise SpecError("sparse_as_dense=false (Horovod's allgather of IndexedSlices) is not measured "
                            "for TensorFlow workloads; use a PyTorch workload")

        compression = Compression.from_spec(config.compression)

        def gradients(tape, loss):
            wrapped = hvd.DistributedGradientTape(tape, compression=compression, sparse_as_dense=True)
            return wrapped.gradient(loss, model.trainable_variables)

        def report() -> tuple[int, int]:
            return tuple(ring_allreduce_bytes(n, size) for n in compression.counts())  # type: ignore[return-value]
    else:
        from hvdsketch.memory import create as create_memory
        from hvdsketch.policy import create
        from hvdsketch.tensorflow import DistributedGradientTape

        if config.sparse_as_dense:
            raise SpecError("sparse_as_dense: hvdsketch's tape keeps IndexedSlices as the compressor takes them "
                            "and has no such option; leave it out on path hvdsketch")
        memory = None if config.memory is None else create_memory(config.memory)  # one for every step
        # a flag string names one exchanger for every tape (and trace); rules get one policy, decided
        # once when first traced
        compression = config.compression if isinstance(config.compression, str) else create(config.compression)

        def gradients(tape, loss):
            tapes.append(DistributedGradientTape(tape, compression=compression, memory=memory))
            return tapes[-1].gradient(loss, model.trainable_variables)

        def report() -> tuple[int, int]:
            counted = tapes[-1].report()  # every tape of one setup shares its exchange, and its counts
            return counted["bytes_sent"], counted["bytes_dense_allreduce"]

    def train_step(inputs, targets):
        with tf.GradientTape() as tape:
            loss = workload.loss(model, (inputs, targets))
        grads = gradients(tape, loss)
        if config.clip:
            grads, _ = tf.clip_by_global_norm(grads, config.clip)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    train_step = tf.function(train_step)
    steps = workload.steps_per_epoch(size)
    if config.steps_per_epoch:
        steps = min(steps, config.steps_per_epoch)
    step_time, done, validation = 0.0, 0, []
    start = time.perf_counter()
    for epoch in range(config.epochs):
        bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{config.epochs}", disable=rank != 0, unit="step",
                   mininterval=5)
        for _, batch in zip(bar, workload.train_batches(epoch, rank, size)):
            t0 = time.perf_counter()
            loss = float(train_step(*batch))
            step_time += time.perf_counter() - t0
            done += 1
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if rank == 0:
            validation.append(workload.evaluate(model))
            print(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in validation[-1].items()), flush=True)
    wall = time.perf_counter() - start
    sent, dense = report()
    return {"workload": str(workload), "compression": config.compression, "memory": config.memory,
            "path": config.path, "rank": rank, "size": size, "epochs": config.epochs, "steps": done,
            "wall_s": wall, "step_s": step_time / max(done, 1), "exchange_s": None,
            "bytes_sent_per_step": sent / max(done, 1), "bytes_dense_per_step": dense / max(done, 1),
            "assignment": None if not tapes or tapes[-1]._session.policy.assignment is None
            else [row.to_dict() for row in tapes[-1]._session.policy.assignment],
            "validation": validation, "config": dataclasses.asdict(config), "environment": environment()}
