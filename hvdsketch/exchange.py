"""Drive many tensors' exchanges in lock step over one communicator.

Each round collects the messages of every tensor still exchanging and hands
them to the communicator at once, so a round costs one fused collective per
reduction op, not one per tensor. After every round each floating result is
checked to be finite: one rank's NaN or Inf reaches every rank's reduction,
so every rank raises the same error and none is left waiting.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any, Sequence

from hvdsketch.collectives import Communicator
from hvdsketch.compress import Compressor, RowSparse, TensorContext, create
from hvdsketch.compress.base import ResidualMemory
from hvdsketch.ops import backend


class AgreementError(RuntimeError):
    """Ranks run with different compression specs or tensor shapes."""


def is_passthrough(tensor: Any) -> bool:
    """Integer and empty tensors are averaged as they are: there is nothing to compress."""
    if isinstance(tensor, RowSparse):
        return False
    ops = backend(tensor)
    return not ops.is_floating(tensor) or 0 in ops.shape(tensor)


def prepared(tensor: Any, compressor: Compressor, memory: ResidualMemory | None = None) -> Any:
    """The tensor as ``compressor`` takes it: a :class:`RowSparse` gradient densified unless the
    compressor keeps it sparse and no residual memory (dense anyway) is in play."""
    if isinstance(tensor, RowSparse) and (memory is not None or not compressor.row_sparse):
        return tensor.to_dense()
    return tensor


def exchange_all(jobs: Sequence[tuple[Compressor, Any, TensorContext]],
                 communicator: Communicator, memory: ResidualMemory | None = None) -> list[Any]:
    """Averaged results of every ``(compressor, tensor, ctx)``, in order, with error feedback
    from ``memory`` if given."""
    dense = create("none")
    seconds = communicator.stats.seconds
    clock = time.perf_counter()
    running = {}
    for i, (compressor, tensor, ctx) in enumerate(jobs):
        tensor = prepared(tensor, compressor, memory)
        running[i] = (dense.exchange(tensor, ctx) if is_passthrough(tensor)
                      else compressor.exchange(tensor, ctx, memory))
    pending = {i: next(gen) for i, gen in running.items()}
    results: list[Any] = [None] * len(jobs)
    while running:
        clock = _lap(seconds, "compress", clock)
        order = list(running)
        reduced = communicator.reduce([m for i in order for m in pending[i]])
        clock = _lap(seconds, "communicate", clock)
        offset = 0
        for i in order:
            count = len(pending[i])
            part = [_finite(r, jobs[i][2]) for r in reduced[offset:offset + count]]
            offset += count
            try:
                pending[i] = running[i].send(part)
            except StopIteration as done:
                results[i] = done.value
                del running[i], pending[i]
        clock = _lap(seconds, "decompress", clock)
    return results


def _lap(seconds: dict[str, float], phase: str, since: float) -> float:
    """Add the time since ``since`` to ``phase``; the new start. (Phases of multi-round methods
    are approximate: work between rounds counts as decompress.)"""
    now = time.perf_counter()
    seconds[phase] += now - since
    return now


def _finite(tensor: Any, ctx: TensorContext) -> Any:
    ops = backend(tensor)
    if not ops.is_floating(tensor):
        return tensor
    return ops.check_finite(tensor, f"hvdsketch: gradient {ctx.name!r} is NaN or Inf on some rank")


def digest(text: str) -> int:
    """A 62-bit digest of ``text``, the same on every rank."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


def verify_agreement(communicator: Communicator, description: str, ops_module: Any) -> None:
    """Fail on every rank unless all ranks pass the same ``description``.

    One allgather of an int64 digest: every rank sees every digest, so all
    ranks reach the same verdict and none hangs. Works eagerly (raises
    :class:`AgreementError`) and inside ``tf.function`` (an assertion op).
    """
    from hvdsketch.compress.base import Message

    local = ops_module.constant([digest(description)], "int64")
    (gathered,) = communicator.reduce([Message(local, "allgather")])
    ops_module.check_all_equal(
        gathered, f"hvdsketch: ranks run different compression setups or models (rank "
                  f"{communicator.rank} runs: {description[:300]}); start every rank with the same "
                  f"--compression / HVDSKETCH_COMPRESSION / config and the same model", AgreementError)
