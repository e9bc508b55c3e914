"""Checkpoints of every rank's state in one file, and what becomes of that state when the world changes.

Residuals and some compressors' state differ on every rank, while Horovod users save on rank 0 only,
so a checkpoint carries every rank's :meth:`Exchanger.state_dict <hvdsketch.exchange.Exchanger.state_dict>`::

    {"format": 3, "world": N, "compression": "topk:ratio=0.05", "memory": "fp32",
     "ranks": [state of rank 0, ..., state of rank N - 1], "checksum": "<sha256 of the rest>"}

and each rank resumes from its own entry. A damaged entry or one of another format is an error; one of
another world size or setup too, unless the caller opts in to starting the per-rank state afresh
(``reset_on_change``, :class:`StateReset`). :func:`gather` and :func:`alone` save, :func:`resolve` and
:func:`broadcast` load, :func:`begin` / :func:`join` agree where a world begins.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import warnings
from typing import Any, Callable, ContextManager, Mapping, Sequence

import numpy as np

from hvdsketch.exchange import agreement
from hvdsketch.exchange.exchanger import Exchanger
from hvdsketch.ops.contract import Ops

#: The version of the checkpoint layout above.
FORMAT = 3
#: How to save every rank's state where the save itself is not collective.
ALONE = "call gather() on every rank, between steps, before rank 0 saves, to resume every rank exactly"


class StateReset(UserWarning):
    """hvdsketch's per-rank state (residuals, compressors' state) was started afresh on every rank."""


def _allgather(exchanger: Exchanger, obj: Any, name: str, ops: Ops) -> list[Any]:
    return agreement.allgather_objects(exchanger.communicator, obj, f"{exchanger.prefix}.{name}", ops)


def _setup(exchanger: Exchanger) -> tuple[str, str | None]:
    return str(exchanger.policy), None if exchanger.memory is None else str(exchanger.memory)


def _sealed(exchanger: Exchanger, ranks: list[Any] | None, **extra: Any) -> dict[str, Any]:
    """The checkpoint of this setup with ``ranks``' states (and ``extra``), its checksum added."""
    compression, memory = _setup(exchanger)
    entry = {"format": FORMAT, "world": exchanger.communicator.size, "compression": compression,
             "memory": memory, "ranks": ranks, **extra}
    return {**entry, "checksum": checksum(entry)}


def gather(exchanger: Exchanger, ops: Ops) -> dict[str, Any]:
    """The checkpoint of every rank's state, where every rank calls it between steps
    (:meth:`Exchanger.check_in <hvdsketch.exchange.Exchanger.check_in>`). Called on this rank alone, it warns
    and gives :func:`alone`'s once the others step on or ``HVDSKETCH_CHECKIN_SECONDS`` pass (default 10)."""
    mine = pickle.dumps(exchanger.state_dict(), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        shares = exchanger.check_in(agreement.CHECKPOINT, mine, ops)
    except agreement.AgreementError:
        raise
    except Exception as error:  # the others never came (a timeout), or left (Horovod shut down)
        raise RuntimeError(f"hvdsketch: rank {exchanger.communicator.rank} could not gather the checkpoint "
                           f"({error}); {agreement.SAVE}") from error
    if shares is None:
        warnings.warn(f"hvdsketch: rank {exchanger.communicator.rank} saves a checkpoint without the other ranks "
                      f"(they did not gather it with this rank within {exchanger.protocol.checkin_seconds:g} s, "
                      f"HVDSKETCH_CHECKIN_SECONDS): it carries no rank's error-feedback residuals or compressors' "
                      f"state, which start afresh on every rank alike when it is loaded; {agreement.SAVE}",
                      stacklevel=3)
        return alone(exchanger)
    return _sealed(exchanger, [pickle.loads(share) for share in shares])


def alone(exchanger: Exchanger) -> dict[str, Any]:
    """The checkpoint of this rank alone, where a save cannot be collective: its step, policy decisions and
    memory plan, with ``"ranks": None`` and no residuals; no communication."""
    return _sealed(exchanger, None, alone=afresh(exchanger.state_dict(residuals=False), keep_setup=True))


def checksum(entry: Mapping[str, Any]) -> str:
    """A SHA-256 of ``entry``'s contents but its ``"checksum"``, walked in order (independent of pickling)."""
    digest = hashlib.sha256()

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            digest.update(b"{")
            for key, item in value.items():
                walk(key)
                walk(item)
            digest.update(b"}")
        elif isinstance(value, (list, tuple)):
            digest.update(b"[")
            for item in value:
                walk(item)
            digest.update(b"]")
        elif isinstance(value, (np.ndarray, np.generic)):
            array = np.ascontiguousarray(value)
            digest.update(f"<{array.dtype.str}{array.shape}>".encode())
            digest.update(array.tobytes())
        else:
            digest.update(f"<{type(value).__name__}:{value!r}>".encode())

    walk({key: value for key, value in entry.items() if key != "checksum"})
    return digest.hexdigest()


def _checked(entry: Any) -> Mapping[str, Any]:
    """``entry`` if it is an intact checkpoint of this format, else a ``ValueError`` naming it."""
    what = "the optimizer state's 'hvdsketch' entry"
    if not isinstance(entry, Mapping) or "ranks" not in entry or "format" not in entry:
        raise ValueError(f"hvdsketch: {what} is not a checkpoint of hvdsketch's state (one made by "
                         f"hvdsketch's DistributedOptimizer.state_dict(), called on every rank)")
    if entry["format"] != FORMAT:
        raise ValueError(f"hvdsketch: {what} has format {entry['format']!r}, written by another version of "
                         f"hvdsketch; this one reads format {FORMAT}")
    if entry.get("checksum") != checksum(entry):
        raise ValueError(f"hvdsketch: {what} is damaged: its contents do not match its checksum (a changed "
                         f"byte in the file, or an edited entry); resume from another checkpoint")
    return entry


def afresh(source: Mapping[str, Any], keep_setup: bool) -> dict[str, Any]:
    """A rank's state with ``source``'s step and no residuals nor compressors' state; with ``keep_setup``,
    ``source``'s policy decisions and memory plans too."""
    def plan(memory: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return None if memory is None or not keep_setup else {**memory, "slots": {}}  # its plan, no residuals

    return {"step": source["step"], "world": source.get("world"), "states": {},
            "policy": source.get("policy") if keep_setup else None,
            "memory": plan(source.get("memory")), "own_memory": plan(source.get("own_memory"))}


def _warn(exchanger: Exchanger, message: str) -> None:
    if exchanger.communicator.rank == 0:
        warnings.warn(StateReset(message), stacklevel=3)


def resolve(checkpoint: Mapping[str, Any], exchanger: Exchanger, reset_on_change: bool = False) -> list[dict[str, Any]]:
    """The per-rank states of ``checkpoint`` for this world (one per rank).

    Raises ``ValueError`` for a damaged entry, another format, or another number of ranks or compression setup
    unless ``reset_on_change``, which starts every rank's per-rank state afresh, keeps the step (and, for another
    world size only, rank 0's policy decisions and memory plan) and warns on rank 0, as for :func:`alone`'s."""
    checkpoint = _checked(checkpoint)
    size = exchanger.communicator.size
    compression, memory = _setup(exchanger)
    gathered = checkpoint["ranks"] is not None
    world_changed = gathered and checkpoint["world"] != size
    setup_changed = (checkpoint["compression"], checkpoint["memory"]) != (compression, memory)
    if gathered and not world_changed and not setup_changed:
        return [{**state, "world": size} for state in checkpoint["ranks"]]
    made = " and ".join(([f"{checkpoint['world']} ranks (this run has {size})"] if world_changed else []) +
                        ([f"compression {checkpoint['compression']!r} with memory {checkpoint['memory']!r} (this run: "
                          f"{compression!r} with {memory!r})"] if setup_changed else []))
    if made and not reset_on_change:
        raise ValueError(f"hvdsketch: the checkpoint was made with {made}; its per-rank state (error-feedback "
                         f"residuals, compressors' state) cannot resume this run exactly. Resume it with the same "
                         f"number of ranks and the same compression, or pass reset_on_change=True to "
                         f"load_state_dict to start that state afresh on every rank (the step is kept)")
    source = checkpoint["ranks"][0] if gathered else checkpoint["alone"]
    state = {**afresh(source, keep_setup=not setup_changed), "world": size}
    why = f"was made with {made}" if made else f"was saved on one rank without every rank's state ({ALONE})"
    _warn(exchanger, f"hvdsketch: the checkpoint {why}: every rank's error-feedback residuals and compressors' "
                     f"state start afresh at step {state['step']}"
                     + ("" if setup_changed else "; the checkpoint's policy decisions and memory plan are kept"))
    return [state] * size


def broadcast(exchanger: Exchanger, states: Sequence[Mapping[str, Any]] | None, root: int,
              ops: Ops) -> Mapping[str, Any] | None:
    """This rank's entry of the root's ``states`` (:func:`resolve`'s), or ``None`` where it has none: collective."""
    rank = exchanger.communicator.rank
    chosen = _allgather(exchanger, states if rank == root else None, "broadcast", ops)[root]
    return None if chosen is None else chosen[rank]


def in_elastic_job() -> bool:
    """Whether this process is a worker of a Horovod elastic job (Horovod's own test)."""
    return bool(int(os.environ.get("HOROVOD_ELASTIC", 0)))


def begin(exchanger: Exchanger, tensors: Callable[[], Sequence[agreement.Tensor]], ops: Ops,
          rejoin: bool = False, scope: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
    """:func:`join` where a world begins: the first step, the first in a world of another size, or ``rejoin``
    (Horovod elastic's sync). Only then is ``tensors()`` called and ``scope()`` (``tf.init_scope``) entered.
    Under Horovod elastic (a sync, an exchanger that has run, an elastic worker) ranks that disagree reset alike."""
    if rejoin or not exchanger.verified or exchanger.world != exchanger.communicator.size:
        with scope():
            join(exchanger, tensors(), ops, elastic=rejoin or exchanger.verified or in_elastic_job())


def join(exchanger: Exchanger, tensors: Sequence[agreement.Tensor], ops: Ops,
         elastic: bool = False) -> None:
    """Begin a world (collective): check every rank runs the same setup (:meth:`Exchanger.verify
    <hvdsketch.exchange.Exchanger.verify>`) at the same step, with state of a world of this size. Where not,
    with ``elastic`` every rank drops its residuals and compressors' state and takes the step, policy decisions
    and memory plan of the lowest rank that has any (rank 0 warns); without, it raises
    :class:`~hvdsketch.exchange.agreement.AgreementError`."""
    exchanger.verify(tensors, ops)
    size = exchanger.communicator.size
    mine = exchanger.state_dict(residuals=False)
    everyone = _allgather(exchanger, mine, "join", ops)
    steps = [state["step"] for state in everyone]
    if len(set(steps)) == 1 and all(state["world"] in (None, size) for state in everyone):
        exchanger.world = size
        return
    if not elastic:
        raise agreement.AgreementError(f"hvdsketch: ranks start at different steps ({steps} on ranks 0 to "
                                       f"{size - 1}): {agreement.RESUME}")
    source = next((rank for rank, state in enumerate(everyone) if state["world"] is not None or state["step"]), 0)
    before = everyone[source]["world"]
    exchanger.load_state_dict({**afresh(everyone[source], keep_setup=True), "world": size}, convert=None)
    _warn(exchanger, f"hvdsketch: the world changed ({before or '?'} -> {size} ranks, steps {steps}): every rank's "
                     f"error-feedback residuals and compressors' state start afresh; step {exchanger.step} and "
                     f"rank {source}'s policy decisions and memory plan are kept")
