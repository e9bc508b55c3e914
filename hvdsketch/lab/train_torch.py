"""The PyTorch training loop of ``hvdsketch train``."""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable

import torch
from tqdm import tqdm

from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.lab.config import TrainConfig, agree, environment


def _optimizer(config: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr)
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)


def _distributed(config: TrainConfig, model: torch.nn.Module, hvd: Any):
    """(optimizer, report) for the configured path; ``report()`` gives bytes sent, dense bytes,
    seconds per exchange phase so far and the policy's assignment table."""
    base = _optimizer(config, model)
    if config.path == "local":
        return Alone(base), lambda: {"sent": 0, "dense": 0, "seconds": {}}
    if config.path == "horovod":
        from hvdsketch.torch import Compression

        compression = Compression.from_spec(config.compression)
        optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                             compression=compression, sparse_as_dense=config.densify)
        size = hvd.size()
        gathered = _count_sparse_allgather(model) if not config.densify else None

        def report() -> dict[str, Any]:
            r = compression.report()
            sparse = (size - 1) * gathered["bytes"] if gathered else 0  # ring allgather of equal blocks
            return {"sent": ring_allreduce_bytes(r["bytes_sent"], size) + sparse,
                    "dense": ring_allreduce_bytes(r["bytes_dense"] + (gathered or {}).get("dense", 0), size),
                    "seconds": {}}
        return optimizer, report

    from hvdsketch.torch import DistributedOptimizer

    optimizer = DistributedOptimizer(base, model.named_parameters(), compression=config.compression,
                                     memory=config.memory, sparse_as_dense=config.densify,
                                     collectives=config.collectives)

    return optimizer, lambda: record_of(optimizer.report())


class Alone:
    """A rank's own optimizer under Horovod's optimizer's calls (``synchronize()``,
    ``skip_synchronize()``) that exchange nothing: path local, each rank training alone."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def synchronize(self) -> None:
        pass

    def skip_synchronize(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def record_of(report: dict[str, Any]) -> dict[str, Any]:
    """What a training record keeps of hvdsketch's ``report()`` (the optimizer's, the DDP hook's)."""
    return {"sent": report["bytes_sent"], "dense": report["bytes_dense_allreduce"], "seconds": report["seconds"],
            "assignment": report["assignment"], "residual_bytes": report["residual_bytes"]}


def _count_sparse_allgather(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the sparse gradients Horovod allgathers (indices and values, as they come from
    autograd, uncoalesced), and their dense size, summed over steps; Horovod's compression never
    sees them, so they are counted as each gradient is accumulated."""
    counted = {"bytes": 0, "dense": 0}

    def count(p: torch.Tensor) -> None:
        if p.grad is not None and p.grad.is_sparse:
            counted["bytes"] += p.grad._indices().nbytes + p.grad._values().nbytes
            counted["dense"] += p.numel() * p.element_size()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(count)
    return counted


def train(config: TrainConfig, workload: Any) -> dict[str, Any]:
    import horovod.torch as hvd

    hvd.init()
    agree(config, hvd)
    torch.set_num_threads(max(1, (torch.get_num_threads()) // hvd.local_size()))
    model = workload.build_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer, report = _distributed(config, model, hvd)

    def step(batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        timing = Timing()
        optimizer.zero_grad()
        loss = workload.loss(model, batch)
        loss.backward()
        timing.mark("backward")
        optimizer.synchronize()
        timing.mark("exchange")
        clip(config, model)
        with optimizer.skip_synchronize():
            optimizer.step()
        return loss, timing.mark("update")

    return fit(config, workload, model, step, hvd.rank(), hvd.size(), report)


def clip(config: TrainConfig, model: torch.nn.Module) -> None:
    """Scale all gradients so that their global L2 norm is at most ``config.clip``, if set.

    A sparse gradient counts by its values (coalesced, so repeated rows are summed first), so the
    result does not depend on whether the exchange handed an embedding's gradient back sparse
    (sketch, Horovod's allgather) or dense (dense allreduce, DDP): every entry of a benchmark
    clips the same way (``torch.nn.utils.clip_grad_norm_`` takes no sparse gradients)."""
    if not config.clip:
        return
    grads = []
    for p in model.parameters():
        if p.grad is not None:
            if p.grad.is_sparse:
                p.grad = p.grad.coalesce()
            grads.append(p.grad._values() if p.grad.is_sparse else p.grad)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(config.clip / (norm + 1e-6), max=1.0)  # clip_grad_norm_'s epsilon
    for g in grads:
        g.mul_(scale)


class Timing:
    """The seconds of a step's parts, each :meth:`mark` ending one (see :mod:`hvdsketch.lab.breakdown`)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._since = time.perf_counter()

    def mark(self, part: str) -> dict[str, float]:
        now = time.perf_counter()
        self.parts[part], self._since = now - self._since, now
        return self.parts


def fit(config: TrainConfig, workload: Any, model: torch.nn.Module,
        step: Callable[[Any], tuple[torch.Tensor, dict[str, float]]], rank: int, size: int,
        report: Callable[[], dict[str, Any]], sharded: bool = False) -> dict[str, Any]:
    """The epochs of training with ``step(batch) -> (loss, seconds of its parts)`` (``backward``,
    ``exchange`` where the exchange is waited for after backward, ``update``: a :class:`Timing`),
    validation on rank 0 after each, and the run's record; ``report()`` gives the bytes sent and dense
    bytes so far, seconds per exchange phase, and optionally the policy's ``assignment`` table. The DDP
    baselines (:mod:`hvdsketch.lab.bench.ddp`) run the same loop, so their records compare line for line.
    ``timing_s`` is the median step's parts with the exchange phases it spent (read from ``report()``
    around each step, outside its timing): a breakdown of the step the record's ``step`` times, which
    the warm-up steps of ``auto`` or a first dense step do not move (:mod:`hvdsketch.lab.breakdown`).

    PyTorch's global generator (dropout masks) is seeded from the workload's seed and the rank, so
    two runs differ only in how they exchange gradients, and their validation quality compares.
    ``sharded``: the model's forward is collective (FSDP2's all-gathers), so every rank validates
    (rank 0 records it)."""
    torch.manual_seed(workload.seed * 65537 + rank)
    steps = workload.steps_per_epoch(size)
    if config.steps_per_epoch:
        steps = min(steps, config.steps_per_epoch)
    exchanged = 0.0  # seconds in the exchange after backward, all steps
    done = 0
    validation, times, steps_parts = [], [], []
    start = time.perf_counter()
    for epoch in range(config.epochs):
        model.train()
        batches = workload.train_batches(epoch, rank, size)
        bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{config.epochs}", disable=rank != 0, unit="step",
                   mininterval=5)
        for _, batch in zip(bar, batches):
            before = report()["seconds"]
            t0 = time.perf_counter()
            loss, parts = step(batch)
            times.append(time.perf_counter() - t0)
            steps_parts.append({**parts, **{phase: seconds - before.get(phase, 0.0)
                                            for phase, seconds in report()["seconds"].items()}})
            exchanged += parts.get("exchange", 0.0)
            done += 1
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if rank == 0 or sharded:
            metrics = workload.evaluate(model)
        if rank == 0:
            validation.append(metrics)
            print(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in validation[-1].items()), flush=True)
    wall = time.perf_counter() - start
    totals = report()
    per_step = 1 / max(done, 1)
    return {"workload": str(workload), "compression": config.compression, "memory": config.memory,
            "path": config.path, "rank": rank, "size": size, "epochs": config.epochs, "steps": done,
            "wall_s": wall, "step_s": sum(times) * per_step, "steps_s": [round(t, 5) for t in times],
            "exchange_s": exchanged * per_step if steps_parts and "exchange" in steps_parts[0] else None,
            "timing_s": steps_parts[sorted(range(done), key=times.__getitem__)[done // 2]] if done else {},
            "phases_s": {k: v * per_step for k, v in totals["seconds"].items()},
            "bytes_sent_per_step": totals["sent"] * per_step, "bytes_dense_per_step": totals["dense"] * per_step,
            "assignment": totals.get("assignment"), "residual_bytes": totals.get("residual_bytes", 0),
            "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "validation": validation, "config": dataclasses.asdict(config),
            "environment": environment()}
