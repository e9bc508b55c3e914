"""Checkpoints of every rank's state in one file, and what happens to that state when the world changes.

Error-feedback residuals and some compressors' state (DGC's velocity, PowerSGD's
residuals) differ on every rank, while Horovod users save on rank 0 only and, on
resume, load that one file on every rank (or load it on rank 0 and broadcast).
So a checkpoint carries every rank's :meth:`Exchanger.state_dict
<hvdsketch.exchange.Exchanger.state_dict>`, gathered from all ranks::

    {"format": 1, "world": N, "compression": "topk:ratio=0.05", "memory": "fp32",
     "ranks": [state of rank 0, ..., state of rank N - 1]}

and each rank resumes from its own entry. The functions here are written against
the exchanger's communicator (an allgather of pickled bytes, counted apart from
gradient bytes), so every framework's adapter uses them alike:

- :func:`gather`: collective. Every rank first checks in with the step tag
  (:meth:`Exchanger.check_in <hvdsketch.exchange.Exchanger.check_in>`): a rank
  that gathers alone meets the other ranks' next training step under the same
  collective name, and both raise, naming the fix.
- :func:`alone`: where a save cannot be collective (TensorFlow's ``checkpoint.save``
  on rank 0 alone, whose ``tf.train.Checkpoint`` serializes as it saves), the
  checkpoint of this rank's step, policy decisions and memory plan, with
  ``"ranks": None``: no per-rank state, and no communication.
- :func:`resolve`: the checkpoint's entries for this world. Another number of
  ranks or another compression setup cannot resume the per-rank state exactly:
  a ``ValueError`` unless the caller opts in to a reset (``reset_on_change``),
  which starts every rank's residuals and compressors' state afresh, keeps the
  step (and, for another number of ranks only, rank 0's policy decisions and
  memory plan), and warns on rank 0 (:class:`StateReset`). A checkpoint
  :func:`alone` resumes so too, warned, in a world of any size.
- :func:`broadcast`: the root's entries to every rank (load on rank 0, then
  broadcast).
- :func:`join`: collective, where a world begins (the first step; Horovod
  elastic's sync after workers were added or removed): checks that every rank
  runs the same setup (:meth:`Exchanger.verify
  <hvdsketch.exchange.Exchanger.verify>`) and is at the same step with state
  made in a world of this size. Outside elastic a mismatch is an
  :class:`~hvdsketch.exchange.agreement.AgreementError` (a checkpoint loaded on
  some ranks only). In elastic (``elastic=True``) the world did change: every
  rank drops its residuals and compressors' per-tensor state alike, takes the
  step, the policy's decisions and the memory plan of the lowest rank that has
  any, and rank 0 warns (:class:`StateReset`). A world of the same size whose
  ranks all restored the same commit keeps its state.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Callable, ContextManager, Mapping, Sequence

from hvdsketch.exchange import agreement
from hvdsketch.exchange.exchanger import Exchanger, without_residuals

#: The version of the checkpoint layout above.
FORMAT = 1
#: How to save every rank's state where the save itself is not collective.
ALONE = "call gather() on every rank, between steps, before rank 0 saves, to resume every rank exactly"


class StateReset(UserWarning):
    """hvdsketch's per-rank state (residuals, compressors' state) was started afresh on every rank."""


def allgather_objects(exchanger: Exchanger, obj: Any, name: str, ops: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, under the exchanger's prefix
    (:func:`hvdsketch.exchange.agreement.allgather_objects`)."""
    return agreement.allgather_objects(exchanger.communicator, obj, f"{exchanger.prefix}.{name}", ops)


def _setup(exchanger: Exchanger) -> tuple[str, str | None]:
    return str(exchanger.policy), None if exchanger.memory is None else str(exchanger.memory)


def gather(exchanger: Exchanger, ops: Any) -> dict[str, Any]:
    """The checkpoint of every rank's state (collective: every rank must call it, between steps)."""
    try:
        exchanger.check_in(agreement.CHECKPOINT, ops)
    except agreement.AgreementError:
        raise
    except Exception as error:  # the others never came (a timeout), or left (Horovod shut down)
        raise RuntimeError(f"hvdsketch: rank {exchanger.communicator.rank} could not gather the checkpoint "
                           f"({error}); {agreement.SAVE}") from error
    compression, memory = _setup(exchanger)
    return {"format": FORMAT, "world": exchanger.communicator.size, "compression": compression, "memory": memory,
            "ranks": allgather_objects(exchanger, exchanger.state_dict(), "checkpoint", ops)}


def alone(exchanger: Exchanger) -> dict[str, Any]:
    """The checkpoint of this rank alone (no collective): no per-rank state; see the module docstring."""
    compression, memory = _setup(exchanger)
    return {"format": FORMAT, "world": exchanger.communicator.size, "compression": compression, "memory": memory,
            "ranks": None, "alone": afresh(exchanger.state_dict(), keep_setup=True)}


def afresh(source: Mapping[str, Any], keep_setup: bool) -> dict[str, Any]:
    """A rank's state with ``source``'s step, and no residuals nor compressors' state; with
    ``keep_setup``, ``source``'s policy decisions and memory plans too (else this run's stay)."""
    def plan(memory: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return None if memory is None or not keep_setup else without_residuals(memory)

    return {"step": source["step"], "world": source.get("world"), "compressors": {},
            "policy": source.get("policy") if keep_setup else None,
            "memory": plan(source.get("memory")), "own_memory": plan(source.get("own_memory"))}


def _warn(exchanger: Exchanger, message: str) -> None:
    if exchanger.communicator.rank == 0:
        warnings.warn(StateReset(message), stacklevel=3)


def resolve(checkpoint: Mapping[str, Any], exchanger: Exchanger, reset_on_change: bool = False) -> list[dict[str, Any]]:
    """The per-rank states of ``checkpoint`` for this world (one per rank); see the module docstring."""
    if not isinstance(checkpoint, Mapping) or checkpoint.get("format") != FORMAT or "ranks" not in checkpoint:
        raise ValueError("hvdsketch: the optimizer state's 'hvdsketch' entry is not a checkpoint of every rank "
                         "(one made by hvdsketch's DistributedOptimizer.state_dict(), called on every rank)")
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
              ops: Any) -> Mapping[str, Any] | None:
    """This rank's entry of the root's ``states`` (what :func:`resolve` gave the root; other ranks'
    ``states`` are ignored), or ``None`` where the root has none: collective."""
    rank = exchanger.communicator.rank
    chosen = allgather_objects(exchanger, states if rank == root else None, "broadcast", ops)[root]
    return None if chosen is None else chosen[rank]


def in_elastic_job() -> bool:
    """Whether this process is a worker of a Horovod elastic job (Horovod's own test)."""
    return bool(int(os.environ.get("HOROVOD_ELASTIC", 0)))


def begin(exchanger: Exchanger, tensors: Callable[[], Sequence[agreement.Tensor]], ops: Any,
          rejoin: bool = False, scope: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
    """:func:`join` where a world begins: the exchanger's first step, its first in a world of
    another size, or where the adapter says so (``rejoin``: Horovod elastic's sync). ``tensors()``
    (the adapter's tensors as the ranks compare them) is asked for, and ``scope()`` (TensorFlow's eager
    ``tf.init_scope``) entered, only then. Ranks that disagree reset alike where a world changes
    under Horovod elastic (an exchanger that has run, a sync, a worker of an elastic job), else raise."""
    if rejoin or not exchanger.verified or exchanger.world != exchanger.communicator.size:
        with scope():
            join(exchanger, tensors(), ops, elastic=rejoin or exchanger.verified or in_elastic_job())


def join(exchanger: Exchanger, tensors: Sequence[agreement.Tensor], ops: Any,
         elastic: bool = False) -> None:
    """Begin a world: collective; see the module docstring."""
    exchanger.verify(tensors, ops)
    size = exchanger.communicator.size
    mine = {key: value for key, value in exchanger.state_dict().items() if key != "compressors"}
    for key in ("memory", "own_memory"):
        mine[key] = None if mine[key] is None else without_residuals(mine[key])
    everyone = allgather_objects(exchanger, mine, "join", ops)
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
