"""Checks that all ranks run the same setup at the same step, failing alike on every rank.

At start, :func:`verify` allgathers a digest of the setup (compression, memory, :func:`tensors`) and, only
where digests differ, the descriptions themselves, so every rank names the same :func:`difference`. Every
step, a tiny ``max`` allreduce of :func:`step_message` rides beside the gradients and is checked before any
gradient is used; its activity (:data:`TRAIN` or :data:`CHECKPOINT`) makes a rank gathering a checkpoint
alone meet the others' training step and raise (:func:`step_error`) instead of hanging.
"""
from __future__ import annotations

import pickle
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from hvdsketch.collectives import Communicator, reduce, side_channel
from hvdsketch.compress.base import Message
from hvdsketch.digests import digest
from hvdsketch.ops.contract import Ops


class AgreementError(RuntimeError):
    """Ranks run different compression setups, models (tensors' names, shapes, dtypes, which take part) or steps."""


class Tensor(NamedTuple):
    """One tensor as the ranks compare it at start."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    #: Why this rank leaves the tensor out of the exchange (``"requires_grad=False"``); empty where it
    #: takes part. A tensor one rank exchanges and another does not would leave the first waiting.
    left_out: str = ""


def tensors(described: Sequence[Tensor]) -> dict[str, str]:
    """``described`` as entries of a description: ``"tensor 'fc.weight'": "float32 (16, 8)"``."""
    return {f"tensor {t.name!r}": f"{t.dtype} {tuple(t.shape)}" + (f", left out ({t.left_out})" if t.left_out else "")
            for t in described}


def share(ops: Ops, blob: bytes) -> list[Message]:
    """A rank's share of an allgather of bytes: its size, then the bytes (host tensors of ``ops``)."""
    data = np.frombuffer(blob, np.uint8)
    size = ops.host_constant([data.size], "int64")
    return [Message(size, "allgather"), Message(ops.from_numpy(data, size), "allgather")]


def shares(ops: Ops, sizes: Any, data: Any) -> list[bytes]:
    """Every rank's bytes, in rank order, from the gathered sizes and bytes of :func:`share`."""
    sizes, data = ops.to_numpy(sizes), ops.to_numpy(data)
    ends = np.cumsum(sizes)
    return [data[end - size:end].tobytes() for end, size in zip(ends, sizes)]


def allgather_objects(communicator: Communicator, obj: Any, name: str, ops: Ops) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order, allgathered on a side channel of ``communicator``
    (counted apart from gradient bytes)."""
    gathered = reduce(side_channel(communicator), share(ops, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                      name)
    return [pickle.loads(blob) for blob in shares(ops, *gathered)]


#: A key one rank's description lacks.
_ABSENT = object()


def difference(everyone: Sequence[Mapping[str, Any]]) -> str | None:
    """The first difference between rank 0's description and another rank's, with both values; ``None`` if none."""
    first = everyone[0]
    for rank, theirs in enumerate(everyone[1:], 1):
        if dict(theirs) == dict(first):
            if list(theirs) != list(first):
                return f"rank {rank} has the same entries as rank 0 in another order ({', '.join(list(theirs)[:3])}, ...)"
            continue
        keys = list(first) + [key for key in theirs if key not in first]
        key = next(key for key in keys if first.get(key, _ABSENT) != theirs.get(key, _ABSENT))
        return f"{key} is {_shown(first.get(key, _ABSENT))} on rank 0 but {_shown(theirs.get(key, _ABSENT))} on rank {rank}"
    return None


def _shown(value: Any) -> str:
    return "absent" if value is _ABSENT else str(value)


def verify(communicator: Communicator, description: Mapping[str, str], ops: Ops,
           advice: str = "start every rank with the same compression (--compression / HVDSKETCH_COMPRESSION / "
                         "config), memory and model (parameters, their dtypes and requires_grad)") -> int:
    """The 40-bit digest of ``description``, which every step's tag carries (collective, eager); raises
    :class:`AgreementError` on every rank, naming the first difference, unless all ranks pass the same one."""
    text = "\n".join(f"{key}={value}" for key, value in description.items())
    local = ops.host_constant([digest(text)], "int64")
    (gathered,) = reduce(communicator, [Message(local, "allgather")], "hvdsketch.agreement")
    if len(set(ops.to_numpy(gathered).tolist())) > 1:  # the same verdict on every rank: all gather next
        everyone = allgather_objects(communicator, dict(description), "hvdsketch.agreement.described", ops)
        raise AgreementError(f"hvdsketch: ranks run different compression setups or models: "
                             f"{difference(everyone)}; {advice}")
    return digest(text, bits=40)


#: What a rank sends its step tag for (the tag's third pair).
TRAIN, CHECKPOINT = 0, 1

#: How to resume a checkpoint on every rank, named by every error a partial resume leads to.
RESUME = ("a checkpoint must be loaded on every rank (each takes its own rank's state from the one file "
          "rank 0 saved), or loaded on rank 0 and then broadcast with "
          "hvdsketch.torch.broadcast_optimizer_state(optimizer, root_rank=0); Horovod's own "
          "hvd.broadcast_optimizer_state does not carry hvdsketch's per-rank state")

#: How to save one: ``state_dict()`` gathers every rank's state.
SAVE = ("optimizer.state_dict() gathers every rank's state (residuals, compressors' state), so every rank "
        "must call it: call state_dict() on every rank, then save on rank 0 "
        "(state = optimizer.state_dict(); if hvd.rank() == 0: torch.save(state, path))")


def step_message(ops: Ops, step: int, setup: int, activity: int = TRAIN) -> Message:
    """This step's tag, reduced by ``max``: ``(step, -step, setup, -setup, activity, -activity)`` in host memory
    (checking it must not wait for an accelerator)."""
    return Message(ops.host_constant([step, -step, setup, -setup, activity, -activity], "int64"), "max")


def step_agrees(ops: Ops, reduced: Any) -> Any:
    """A 0-d truth (a tensor of the back-end) that every rank sent the same step, setup and activity."""
    return ops.reduce_min(ops.cast(reduced[0::2] == -reduced[1::2], "int64")) > 0


def step_error(step: int, rank: int, reduced: Sequence[int] | None = None) -> AgreementError:
    """The error every rank raises when the tag disagrees; ``reduced`` (the tag as integers, if readable) names
    what differs: the activity, the step or the setup."""
    if reduced is not None and reduced[4] != -reduced[5]:
        return AgreementError(f"hvdsketch: some ranks gather a checkpoint while others train (rank {rank} is at "
                              f"step {step}); {SAVE}")
    if reduced is not None and reduced[0] != -reduced[1]:
        return AgreementError(f"hvdsketch: ranks are at different steps (rank {rank} is at step {step}, others "
                              f"between {-reduced[1]} and {reduced[0]}): {RESUME}")
    return AgreementError(
        f"hvdsketch: ranks are at different steps or run different setups (rank {rank} is at step {step}); "
        f"{RESUME}; and every rank must run the same compression")
