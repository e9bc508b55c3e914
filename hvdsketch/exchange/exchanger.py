"""The exchanger: every gradient's exchange starts when that gradient is ready; a step waits once.

The PyTorch optimizer calls :meth:`Exchanger.start` from each parameter's
gradient hook, while backward goes on, and :meth:`Exchanger.finish` before the
optimizer's step; the TensorFlow tape calls both for the gradients it computed.
``start`` asks the policy for the tensor's compressor (decided at the last step
boundary, never mid-step), starts a :class:`~hvdsketch.exchange.flight.Flight`
(error feedback included) and sends its first round through the non-blocking
communicator; it also moves on every earlier tensor whose round has landed, so
multi-round methods advance while backward still runs. ``finish`` waits only
for what is still in flight, runs the last rounds, and checks, in one host
sync, that every result is finite and that every rank was at the same step with
the same setup (:mod:`~hvdsketch.exchange.agreement`): one rank's NaN or Inf
reaches every rank's reduction, so every rank raises alike and none is left
waiting. Then, at the step boundary, the policy may look at the step's
gradients and decide for the next steps (``auto``).

A tensor that is still waiting after ``stall_seconds`` (``HVDSKETCH_STALL_SECONDS``,
default 30) is reported on that rank with what it waits for, every
``stall_seconds`` until it arrives.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, ContextManager, Literal, Mapping, Sequence

from hvdsketch.collectives import Communicator, Handle
from hvdsketch.compress import Compressor, RowSparse, TensorContext, create
from hvdsketch.compress.support import values_of
from hvdsketch.exchange import agreement
from hvdsketch.exchange.flight import Flight
from hvdsketch.memory import Fp32, Memory
from hvdsketch.ops import backend

Reduction = Literal["average", "sum"]


def is_passthrough(tensor: Any) -> bool:
    """Integer and empty tensors are averaged as they are: there is nothing to compress."""
    if isinstance(tensor, RowSparse):
        return False
    ops = backend(tensor)
    return not ops.is_floating(tensor) or 0 in ops.shape(tensor)


class Exchanger:
    """Averages many tensors per step across the ranks of ``communicator``.

    Args:
        policy: a :class:`hvdsketch.policy.Policy`: each tensor's compressor.
        communicator: moves the messages (:mod:`hvdsketch.collectives`).
        memory: residual memory (error feedback) for every tensor, or ``None``; methods whose
            error feedback is part of the algorithm (``Compressor.feedback``) then keep float32
            residuals of their own.
        op: ``"average"`` (Horovod's ``Average``) or ``"sum"``.
        sparse_as_dense: densify row-sparse gradients before compressing them.
        prefix: the start of every collective's name (two exchangers in one process need two).
        placement: ``placement(name)`` is the context in which tensor ``name``'s exchange work
            runs (the TensorFlow tape's ``device_dense`` / ``device_sparse``); none by default.
    """

    def __init__(self, policy: Any, communicator: Communicator, memory: Memory | None = None,
                 op: Reduction = "average", sparse_as_dense: bool = False, prefix: str = "hvdsketch",
                 placement: Callable[[str], ContextManager] | None = None) -> None:
        if op not in ("average", "sum"):
            raise ValueError(f"hvdsketch: op must be average or sum, got {op!r}")
        self.policy, self.communicator, self.memory = policy, communicator, memory
        self.op, self.sparse_as_dense, self.prefix = op, sparse_as_dense, prefix
        self.placement = placement or (lambda name: contextlib.nullcontext())
        self.step = 0
        #: Residuals of the methods whose error feedback is their own, when ``memory`` is ``None``.
        self.own_memory = Memory(default=Fp32(), spec="fp32")
        self.stall_seconds = float(os.environ.get("HVDSKETCH_STALL_SECONDS", 30))
        self._setup = 0
        #: The tensors' names in the adapter's order (parameters, sources), from :meth:`verify`.
        self.order: dict[str, int] = {}
        #: True once :meth:`verify` has run.
        self.verified = False
        self._dense = create("none")
        self._flights: dict[str, tuple[Flight, Handle | None]] = {}  # handle None: done
        self._inputs: list[tuple[Any, TensorContext]] = []
        self._tag: Handle | None = None

    # -- setup ------------------------------------------------------------------------------------

    def verify(self, tensors: Sequence[tuple[str, tuple[int, ...]]], ops: Any, like: Any = None) -> None:
        """Check once that every rank runs the same policy, memory and ``tensors`` (names and shapes,
        in the order the adapter knows them, which orders the policy's view of a step); the digest
        is part of every step's check from here on."""
        self.order = {name: i for i, (name, _) in enumerate(tensors)}
        layout = ";".join(f"{name}:{tuple(shape)}" for name, shape in tensors)
        full = f"{self.policy}|{self.memory}|{self.op}|{self.sparse_as_dense}|{layout}"
        agreement.verify(self.communicator, full, ops, like)
        self._setup = agreement.digest(full, bits=40)
        self.verified = True

    @property
    def in_flight(self) -> list[str]:
        """Names of the tensors whose exchange has started and not been finished."""
        return list(self._flights)

    # -- one step ---------------------------------------------------------------------------------

    def start(self, name: str, tensor: Any) -> None:
        """Start exchanging ``tensor`` (dense, or :class:`RowSparse`) under ``name``."""
        began = time.perf_counter()
        self._start(name, tensor)
        self.communicator.stats.seconds["start"] += time.perf_counter() - began

    def _start(self, name: str, tensor: Any) -> None:
        if name in self._flights:
            raise RuntimeError(f"hvdsketch: {name!r} was started twice in one step")
        values = values_of(tensor)
        ops = backend(values)
        if self._tag is None:
            self._tag = self._send(f"{self.prefix}.step", [agreement.step_message(ops, self.step, self._setup, values)])
        shape = tensor.dense_shape if isinstance(tensor, RowSparse) else ops.shape(tensor)
        ctx = TensorContext(name, tuple(shape), self.step, self.communicator.size, self.communicator.rank)
        compressor = self._dense if is_passthrough(tensor) else self.policy.compressor(ctx)
        memory = self._memory_for(compressor)
        if isinstance(tensor, RowSparse) and (self.sparse_as_dense or not compressor.row_sparse
                                              or (memory is not None and memory.keeps(name))):
            tensor = tensor.to_dense()
        if memory is not None and ops.is_symbolic(values):
            raise ValueError(f"hvdsketch: {compressor} with residual memory keeps its state between steps in "
                             f"Python, which tf.function would freeze at tracing; run the step eagerly")
        if self.policy.wants_inputs:
            self._inputs.append((tensor, ctx))
        self._progress()
        with self.placement(name):
            flight = Flight(compressor, tensor, ctx, memory)
            self._flights[name] = (flight, self._send_round(flight))
            flight.settle()

    def finish(self) -> dict[str, Any]:
        """Wait for every exchange started this step; their averaged results by name.

        Round ``k`` of every tensor still exchanging is waited for, then round ``k + 1`` of each
        started, so the rounds of multi-round methods travel together."""
        began = time.perf_counter()
        tag, self._tag = self._tag, None
        try:
            while any(handle is not None for _, handle in self._flights.values()):
                for name, (flight, handle) in list(self._flights.items()):
                    if handle is not None:
                        self._step_flight(name, flight, self._wait(handle, [name]))
            results = {name: flight.result for name, (flight, _) in self._flights.items()}
            reduced_tag = None if tag is None else self._wait(tag, ["the step check"])[0]
        finally:
            self._flights.clear()
        results = self._check(results, reduced_tag)
        if self.op == "sum":
            results = {name: _scaled(r, self.communicator.size) for name, r in results.items()}
        self.communicator.stats.seconds["finish"] += time.perf_counter() - began
        inputs, self._inputs = self._inputs, []
        inputs.sort(key=lambda item: self.order.get(item[1].name, len(self.order)))
        self.policy.end_step(inputs, self.communicator)
        self.step += 1
        return results

    def exchange(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """Start and finish one step of ``tensors`` at once (where no hook can start them earlier)."""
        for name, tensor in tensors.items():
            self.start(name, tensor)
        return self.finish()

    # -- inside a step ----------------------------------------------------------------------------

    def _memory_for(self, compressor: Compressor) -> Memory | None:
        if self.memory is not None:
            return self.memory
        return self.own_memory if compressor.feedback else None

    def _send(self, name: str, messages: list) -> Handle:
        return self.communicator.start(messages, name)

    def _send_round(self, flight: Flight) -> Handle:
        return self._send(f"{self.prefix}.{flight.ctx.name}.r{flight.index}", flight.messages)

    def _step_flight(self, name: str, flight: Flight, reduced: list[Any]) -> None:
        """Give ``flight`` its round's reduction and send its next round, if any."""
        with self.placement(name):
            if flight.advance(reduced):
                self._flights[name] = (flight, None)
            else:
                self._flights[name] = (flight, self._send_round(flight))
                flight.settle()

    def _progress(self) -> None:
        """Move on, without blocking, every exchange whose early round has landed (a round that
        settles nothing yet is followed by another: PowerSGD's P, the union's bitmap)."""
        for name, (flight, handle) in list(self._flights.items()):
            if handle is not None and flight.round.residual is None and handle.test():
                self._step_flight(name, flight, handle.wait())

    def _wait(self, handle: Handle, waiting_for: list[str]) -> list[Any]:
        """``handle.wait()``, reporting every ``stall_seconds`` while it has not arrived."""
        started = time.monotonic()
        reported = started
        while not handle.test():
            now = time.monotonic()
            if now - reported >= self.stall_seconds:
                reported = now
                print(f"hvdsketch: rank {self.communicator.rank} has waited {now - started:.0f} s at step "
                      f"{self.step} for {', '.join(waiting_for)} (in flight: {', '.join(self._flights) or '-'}); "
                      f"another rank may not have started the same exchanges", file=sys.stderr, flush=True)
            time.sleep(0.0005)
        return handle.wait()

    def _check(self, results: dict[str, Any], tag: Any) -> dict[str, Any]:
        """Every result finite and the step tag agreed, else the same error on every rank: one host
        sync eagerly; inside ``tf.function``, assertions that run with the step."""
        floating = {name: values_of(r) for name, r in results.items()
                    if backend(values_of(r)).is_floating(values_of(r))}
        if not floating and tag is None:
            return results
        ops = backend(tag if tag is not None else next(iter(floating.values())))
        agreed = None if tag is None else agreement.step_agrees(ops, tag)
        if ops.is_symbolic(agreed if agreed is not None else next(iter(floating.values()))):
            if agreed is not None:
                ops.check_true(agreed, str(agreement.step_error(self.step, self.communicator.rank)))
            return {name: _with_values(r, ops.check_finite(values_of(r), _nonfinite(name)))
                    if name in floating else r for name, r in results.items()}
        flags = [ops.all_finite_flag(r) for r in floating.values()]
        if ops.all_true(flags + ([agreed] if agreed is not None else [])):
            return results
        if agreed is not None and not ops.all_true([agreed]):
            raise agreement.step_error(self.step, self.communicator.rank)
        bad = [name for name, flag in zip(floating, flags) if not ops.all_true([flag])]
        raise FloatingPointError(_nonfinite(bad[0]) + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: the step (it seeds the hashes), the policy's choices, the compressors'
        per-tensor state and the residuals, as numpy arrays and plain values."""
        compressors = {flag: c.state_dict() for flag, c in self.policy.compressors().items()}
        return {"step": self.step, "policy": self.policy.state_dict(),
                "compressors": {flag: s for flag, s in compressors.items() if s},
                "memory": None if self.memory is None else self.memory.state_dict(),
                "own_memory": self.own_memory.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any], convert: Any) -> None:
        """Restore :meth:`state_dict`; ``convert(name, array)`` makes the tensor of each array."""
        if self._flights:
            raise RuntimeError("hvdsketch: cannot load state while exchanges are in flight")
        self.step = int(state["step"])
        self.policy.load_state_dict(state.get("policy") or {})
        compressors = self.policy.compressors()
        for flag, compressor_state in (state.get("compressors") or {}).items():
            if flag not in compressors:
                raise ValueError(f"hvdsketch: the checkpoint holds state of compressor {flag!r}, which "
                                 f"this run's compression {self.policy} does not use")
            compressors[flag].load_state_dict(compressor_state, convert)
        if self.memory is not None and state.get("memory") is not None:
            self.memory.load_state_dict(state["memory"])
        if state.get("own_memory") is not None:
            self.own_memory.load_state_dict(state["own_memory"])


def _nonfinite(name: str) -> str:
    return f"hvdsketch: gradient {name!r} is NaN or Inf on some rank"


def _with_values(result: Any, values: Any) -> Any:
    """``result`` (dense, or :class:`RowSparse`) with ``values`` in place of its values."""
    return RowSparse(result.indices, values, result.dense_shape) if isinstance(result, RowSparse) else values


def _scaled(result: Any, factor: float) -> Any:
    return _with_values(result, values_of(result) * factor)
