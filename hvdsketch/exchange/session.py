"""The one object every front end holds: hvdsketch's engine behind one door.

A :class:`Session` assembles an exchanger from ``compression=``, ``memory=`` and a communicator, runs its
exchanges, agrees with the other ranks where a world begins, handles checkpoints
(:mod:`hvdsketch.exchange.checkpoint`) and reports. Front ends import nothing else of ``exchange/``,
``memory/`` or ``policy/``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Mapping, Sequence

from hvdsketch.collectives import Communicator
from hvdsketch.collectives.stats import ring_allreduce_bytes
from hvdsketch.exchange import checkpoint
from hvdsketch.exchange.agreement import AgreementError, Tensor, verify
from hvdsketch.exchange.checkpoint import ALONE, StateReset, afresh, in_elastic_job
from hvdsketch.exchange.exchanger import Exchanger
from hvdsketch.memory import Memory
from hvdsketch.memory import create as create_memory
from hvdsketch.ops.contract import Ops
from hvdsketch.policy import Policy
from hvdsketch.policy import create as create_policy
from hvdsketch.policy.flag import unwrapped
from hvdsketch.policy.scatter import create as create_scatter_policy


class Session:
    """A front end's exchanges of one setup, their state and its checkpoints.

    Args:
        compression: a flag, per-tensor rules, a compressor or a policy
            (:func:`hvdsketch.policy.create`).
        memory: a ``--memory`` flag, a :class:`~hvdsketch.memory.Memory`, or ``None`` for no error feedback.
        communicator: moves the messages (:mod:`hvdsketch.collectives`).
        ops: the array back-end of the front end's tensors (:mod:`hvdsketch.ops`).
        scatter: the exchanges are reduce-scatters (FSDP2's): ``compression`` names a reduce-scatter
            method or ``auto`` over them (:func:`hvdsketch.policy.scatter.create`).
        options: the :class:`~hvdsketch.exchange.Exchanger`'s own (``op``, ``prefix``,
            ``sparse_as_dense``, ``placement``, ``error_if_nonfinite``).

    Raises:
        hvdsketch.spec.SpecError: a flag that names nothing valid.

    Example::

        session = Session("topk:ratio=0.01", "fp32", TorchDistCommunicator(), torch_ops, prefix="hvdsketch.ddp")
        session.begin(lambda: [Tensor("w", (10, 4), "float32")])
        averaged = session.exchange({"w": grad})
    """

    def __init__(self, compression: Any, memory: "str | Memory | None", communicator: Communicator, ops: Ops,
                 scatter: bool = False, **options: Any) -> None:
        policy = (create_scatter_policy if scatter else create_policy)(compression)
        self.exchanger = Exchanger(policy, communicator, None if memory is None else create_memory(memory), **options)
        self.ops = ops

    # -- the engine's parts, read ------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self.exchanger.policy

    @property
    def memory(self) -> Memory | None:
        return self.exchanger.memory

    @property
    def communicator(self) -> Communicator:
        return self.exchanger.communicator

    @property
    def step(self) -> int:
        """Steps exchanged (it seeds the hashes); a front end adds the steps its traced graphs ran."""
        return self.exchanger.step

    @step.setter
    def step(self, step: int) -> None:
        self.exchanger.step = step

    @property
    def in_flight(self) -> list[str]:
        """Names of the tensors whose exchange has started and not been finished."""
        return self.exchanger.in_flight

    @property
    def stood(self) -> Any:
        """Whether the last step stood (its averages finite): a 0-d truth of each run where it was traced."""
        return self.exchanger.stood

    def traceable(self) -> bool:
        """Whether a traced graph can hold this setup's state (:meth:`~hvdsketch.compress.Compressor.traceable`)."""
        memory = self.exchanger.memory
        return (memory is None or memory.traceable()) and all(c.traceable() for c in self.policy.compressors().values())

    # -- a step ------------------------------------------------------------------------------------

    def begin(self, tensors: Callable[[], Sequence[Tensor]], rejoin: bool = False,
              scope: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
        """Agree with every rank where a world begins (:func:`hvdsketch.exchange.checkpoint.begin`);
        ``tensors()`` is the front end's tensors as the ranks compare them."""
        checkpoint.begin(self.exchanger, tensors, self.ops, rejoin=rejoin, scope=scope)

    def expect(self, names: Sequence[str]) -> None:
        """The tensors every step exchanges, in the order their rounds launch (backward's is best)."""
        self.exchanger.expect(names)

    def start(self, name: str, tensor: Any, out: Any = None) -> None:
        """Start exchanging ``tensor`` under ``name``; the dense average goes into ``out`` where given."""
        self.exchanger.start(name, tensor, out)

    def complete(self, name: str) -> Any:
        """Wait for ``name``'s exchange alone and return its average."""
        return self.exchanger.complete(name)

    def finish(self) -> dict[str, Any]:
        """Wait for every exchange of the step: the averages by name."""
        return self.exchanger.finish()

    def exchange(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """Start and finish the exchanges of ``tensors`` (name to tensor): the averages by name."""
        return self.exchanger.exchange(tensors)

    def abandon(self) -> None:
        """Forget a step broken off by a failure: its exchanges never finish."""
        self.exchanger.abandon()

    def decide(self, tensors: Sequence[tuple[Any, Any]]) -> None:
        """A policy yet to decide decides now, on eager stand-ins ``(tensor, TensorContext)`` of a
        traced step's tensors (a traced graph keeps its compressors)."""
        if self.policy.pending:
            self.policy.end_step(list(tensors), self.communicator, traced=True)

    # -- checkpoints -------------------------------------------------------------------------------

    def state_dict(self, residuals: bool = True) -> dict[str, Any]:
        """This rank's state alone, no communication (:meth:`Exchanger.state_dict
        <hvdsketch.exchange.Exchanger.state_dict>`)."""
        return self.exchanger.state_dict(residuals)

    def load_state_dict(self, state: Mapping[str, Any], convert: Callable[[str, Any], Any]) -> None:
        """Restore :meth:`state_dict`; ``convert(name, array)`` makes each array the tensor it was."""
        self.exchanger.load_state_dict(state, convert)

    def gather(self) -> dict[str, Any]:
        """The checkpoint of every rank's state (:func:`hvdsketch.exchange.checkpoint.gather`)."""
        return checkpoint.gather(self.exchanger, self.ops)

    def alone(self) -> dict[str, Any]:
        """The checkpoint of this rank alone, without residuals (:func:`hvdsketch.exchange.checkpoint.alone`)."""
        return checkpoint.alone(self.exchanger)

    def resolve(self, entry: Mapping[str, Any], reset_on_change: bool = False) -> list[dict[str, Any]]:
        """Every rank's state in ``entry`` for this world (:func:`hvdsketch.exchange.checkpoint.resolve`).

        Raises:
            ValueError: ``entry`` damaged, of another format, or of another world or setup without
                ``reset_on_change``.
        """
        return checkpoint.resolve(entry, self.exchanger, reset_on_change)

    def load(self, states: Sequence[Mapping[str, Any]], convert: Callable[[str, Any], Any]) -> None:
        """Resume this rank from its entry of :meth:`resolve`'s ``states``."""
        self.exchanger.load_state_dict(states[self.communicator.rank], convert)

    def broadcast(self, states: Sequence[Mapping[str, Any]] | None, root: int) -> Mapping[str, Any] | None:
        """This rank's entry of the root's ``states`` (collective; ``None`` where the root has none)."""
        return checkpoint.broadcast(self.exchanger, states, root, self.ops)

    # -- reports -----------------------------------------------------------------------------------

    def report(self, dense_bytes: int, sent: int | None = None, steps: int | None = None) -> dict[str, Any]:
        """What compression saved on this rank, whose gradients held ``dense_bytes`` in all.

        Args:
            dense_bytes: the bytes of every gradient exchanged, dense.
            sent, steps: totals where the front end counts them itself (steps run by a traced
                graph); by default the communicator's bytes and the exchanger's steps.

        Returns:
            ``bytes_sent``; ``bytes_dense_allreduce``, what a ring allreduce of the gradients sends a
            rank (``2 (N - 1) / N`` of ``dense_bytes``) and ``ratio``, that over ``bytes_sent``;
            ``assignment``, the policy's table (``None`` for one compressor, or before it decided);
            the seconds spent, the residual bytes kept and every collective's counts.
        """
        exchanger, stats = self.exchanger, self.communicator.stats
        sent = stats.bytes_sent if sent is None else sent
        dense = ring_allreduce_bytes(dense_bytes, self.communicator.size)
        table = self.policy.assignment
        return {"compression": str(self.policy), "steps": exchanger.step if steps is None else steps,
                "bytes_sent": sent, "bytes_dense_allreduce": dense, "ratio": dense / sent if sent else float("nan"),
                "assignment": None if table is None else [row.to_dict() for row in table],
                "seconds": dict(stats.seconds),
                "residual_bytes": exchanger.table.residual_bytes(),
                "collectives": stats.snapshot()}


__all__ = ["ALONE", "AgreementError", "Memory", "Policy", "Session", "StateReset", "Tensor", "afresh",
           "create_policy", "in_elastic_job", "unwrapped", "verify"]
