"""The TensorFlow (tf-keras) training loop of ``hvdsketch train``: one ``tf.function`` step."""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from tqdm import tqdm

from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.spec import SpecError
from hvdsketch.lab.config import TrainConfig, environment


def train(config: TrainConfig, workload: Any) -> dict[str, Any]:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import horovod.tensorflow as hvd
    import tensorflow as tf
    import tf_keras as keras

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = workload.build_model()
    optimizer = (keras.optimizers.Adam(config.lr) if config.optimizer == "adam"
                 else keras.optimizers.SGD(config.lr, momentum=config.momentum))
    hvd.broadcast_variables(model.variables, root_rank=0)

    if config.collectives != "horovod":
        raise SpecError("collectives: mpi trains PyTorch workloads only (hvdsketch.torch.DistributedOptimizer)")
    policy = None  # hvdsketch's path: the per-tensor policy, whose assignment the record keeps
    if config.path == "horovod":
        from hvdsketch.tensorflow import Compression

        if not config.sparse_as_dense:
            raise SpecError("sparse_as_dense=false (Horovod's allgather of IndexedSlices) is not measured "
                            "for TensorFlow workloads; use a PyTorch workload")

        compression = Compression.from_spec(config.compression)

        def wrap(tape):
            return hvd.DistributedGradientTape(tape, compression=compression, sparse_as_dense=True)

        def report() -> tuple[int, int]:
            return (ring_allreduce_bytes(int(compression.bytes_sent.numpy()), size),
                    ring_allreduce_bytes(int(compression.bytes_dense.numpy()), size))
    else:
        from hvdsketch.policy import create
        from hvdsketch.tensorflow import DistributedGradientTape

        traced = []  # the tapes made while tracing; the last one's counters hold one step's bytes
        policy = create(config.compression)  # one for every trace: decided once, when first traced

        def wrap(tape):
            traced.append(DistributedGradientTape(tape, compression=policy))
            return traced[-1]

        def report() -> tuple[int, int]:
            dense = sum(v.shape.num_elements() * v.dtype.size for v in model.trainable_variables)
            return traced[-1]._communicator.stats.bytes_sent * done, ring_allreduce_bytes(dense, size) * done

    @tf.function
    def train_step(inputs, targets):
        with tf.GradientTape() as tape:
            loss = workload.loss(model, (inputs, targets))
        grads = wrap(tape).gradient(loss, model.trainable_variables)
        if config.clip:
            grads, _ = tf.clip_by_global_norm(grads, config.clip)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

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
            "assignment": None if policy is None or policy.assignment is None
            else [row.to_dict() for row in policy.assignment],
            "validation": validation, "config": dataclasses.asdict(config), "environment": environment()}
