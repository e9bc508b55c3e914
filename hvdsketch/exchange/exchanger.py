"""The exchanger: every gradient's exchange starts when that gradient is ready; a step waits once.

Front ends call :meth:`Exchanger.start` as each gradient is ready (PyTorch: from its hook, while
backward goes on) and :meth:`Exchanger.finish` before the optimizer's step. ``start`` asks the policy
for the tensor's compressor (decided at step boundaries only), starts its
:class:`~hvdsketch.exchange.flight.Flight` and sends its first round; every earlier round that has
landed moves on (:mod:`~hvdsketch.exchange.scheduler`). ``finish`` checks that every rank is at the
same step and setup (:mod:`~hvdsketch.exchange.protocol`), waits for what is in flight and checks in
one host sync that every result is finite. A result that is not is handed back as it is, as Horovod
and DDP do, for a loss scaler to skip the step, and the step leaves no trace: residuals, compressor
records, decisions and the step count are as before it on every rank (rank 0 warns once,
:class:`~hvdsketch.exchange.diagnosis.NonfiniteStep`); a method's own overflow on finite gradients is
exchanged again exactly. With ``error_if_nonfinite=True`` every rank raises alike instead. A finite
step then lets the policy decide for the next steps (``auto``).

A wait longer than ``HVDSKETCH_STALL_SECONDS`` is reported, and ends the job after Horovod's
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` where set (:mod:`~hvdsketch.exchange.watchdog`). Inside
``tf.function`` every context has step 0, a trace is no step and no step tag is sent. bfloat16 is
exchanged as float32. ``start(..., out=)`` writes the dense result into the tensor's own memory. A
communicator that matches collectives by call order (MPI) gets its rounds in one order on every rank
(:mod:`~hvdsketch.exchange.ordering`), the order :meth:`Exchanger.expect` names.

Each tensor's state between steps (its compressor's record and its residual) is in the exchanger's
one :class:`~hvdsketch.exchange.table.TensorTable` (``table``); :meth:`Exchanger.state_dict` is this
rank's state, that table included (:mod:`~hvdsketch.exchange.checkpoint`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
import warnings
from typing import Any, Callable, ContextManager, Literal, Mapping, Sequence

from hvdsketch.collectives import Communicator
from hvdsketch.compress import Compressor, RowSparse, TensorContext, create
from hvdsketch.exchange.flight import Flight
from hvdsketch.compress.state import Undo, undoable
from hvdsketch.compress.support import is_passthrough, values_of
from hvdsketch.exchange import agreement
from hvdsketch.exchange.diagnosis import CARRIED_AS, NARROW, NonfiniteStep, nonfinite_message
from hvdsketch.exchange.protocol import StepProtocol
from hvdsketch.exchange.scheduler import Scheduler
from hvdsketch.exchange.table import Kept, TensorTable
from hvdsketch.exchange.watchdog import Watchdog, report_seconds, shutdown_seconds
from hvdsketch.memory import Memory
from hvdsketch.ops import backend
from hvdsketch.policy.base import Policy
from hvdsketch.ops.contract import Ops

Reduction = Literal["average", "sum"]


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
        error_if_nonfinite: ``False`` (the default): a NaN or Inf result is handed back as it is and
            the step leaves the state as it was (eager steps); ``True``: raise ``FloatingPointError``
            on every rank instead.
    """

    def __init__(self, policy: Policy, communicator: Communicator, memory: Memory | None = None,
                 op: Reduction = "average", sparse_as_dense: bool = False, prefix: str = "hvdsketch",
                 placement: Callable[[str], ContextManager] | None = None, error_if_nonfinite: bool = False) -> None:
        if op not in ("average", "sum"):
            raise ValueError(f"hvdsketch: op must be average or sum, got {op!r}")
        if not isinstance(error_if_nonfinite, bool):
            raise TypeError(f"hvdsketch: error_if_nonfinite must be True or False, got {error_if_nonfinite!r}")
        self.policy, self.communicator = policy, communicator
        self.op, self.sparse_as_dense, self.prefix = op, sparse_as_dense, prefix
        self.placement = placement or (lambda name: contextlib.nullcontext())
        self.error_if_nonfinite = error_if_nonfinite
        self.step = 0
        #: The number of ranks this rank's state was made with (set when the ranks agree,
        #: :mod:`~hvdsketch.exchange.checkpoint`), ``None`` before.
        self.world: int | None = None
        #: Each tensor's compressor record and residual.
        self.table = TensorTable(memory)
        self.watchdog = Watchdog(report_seconds(), shutdown_seconds())
        #: This step's flights (:mod:`~hvdsketch.exchange.scheduler`).
        self.flights = Scheduler(communicator, prefix, self.placement)
        #: The step tags and check-ins (:mod:`~hvdsketch.exchange.protocol`); a check-in waits
        #: ``HVDSKETCH_CHECKIN_SECONDS`` (default 10) for the other ranks.
        self.protocol = StepProtocol(communicator, self.flights.wait, f"{prefix}.step",
                                     float(os.environ.get("HVDSKETCH_CHECKIN_SECONDS", 10)))
        #: The tensors' names in the adapter's order (parameters, sources), from :meth:`verify`.
        self.order: dict[str, int] = {}
        #: True once :meth:`verify` has run.
        self.verified = False
        self._dense = create("none")
        self._expected: list[str] | None = None
        self._inputs: list[tuple[Any, TensorContext]] = []
        self._traced = False  # this step's tensors are symbolic (tf.function tracing)
        #: This step's tensors as given (to tell, when a result is not finite, whether this rank's
        #: own input was), the wire's 16-bit dtype of each that sends one, and the dtype of each
        #: exchanged in another (bfloat16 as float32).
        self._given: dict[str, Any] = {}
        self._narrow: dict[str, tuple[str, str]] = {}
        self._carried: dict[str, str] = {}
        #: The state before this step (eager steps), and the held memory it writes (a traced graph's),
        #: put back where the step is not finite.
        self._before: Kept | None = None
        self._undo: Undo | None = None
        #: Whether the last step stood (its averages finite, or exchanged exactly): a 0-d truth of
        #: each run where the step was traced; else a step left no trace.
        self.stood: Any = True
        #: This step's inputs of methods that can overflow (:attr:`Compressor.overflows`), by name.
        self._kept: dict[str, tuple[Any, TensorContext, Compressor]] = {}
        self._warned: set[str] = set()  # the kinds of warning rank 0 gave (once each)
        self._rows = create("allgather")

    @property
    def memory(self) -> Memory | None:
        """The residual memory the exchanger was made with (``None``: none)."""
        return self.table.memory

    # -- setup ------------------------------------------------------------------------------------

    def verify(self, tensors: Sequence[agreement.Tensor], ops: Ops) -> None:
        """Check once that every rank runs the same policy, memory and ``tensors`` (names, shapes,
        dtypes, which take part, in the order the adapter knows them, which orders the policy's view
        of a step); the digest is part of every step's check from here on."""
        self.order = {t.name: i for i, t in enumerate(tensors)}
        setup = {"compression": str(self.policy), "memory": str(self.memory), "op": self.op,
                 "sparse_as_dense": str(self.sparse_as_dense), "error_if_nonfinite": str(self.error_if_nonfinite)}
        self.protocol.setup = agreement.verify(self.communicator, {**setup, **agreement.tensors(tensors)}, ops)
        self.verified = True

    def expect(self, names: Sequence[str]) -> None:
        """The tensors every step exchanges, in the order their rounds are launched where the
        communicator needs one order on every rank (gradient-ready order is best: backward's)."""
        self._expected = list(names)

    @property
    def in_flight(self) -> list[str]:
        """Names of the tensors whose exchange has started and not been finished."""
        return self.flights.names

    # -- one step ---------------------------------------------------------------------------------

    def start(self, name: str, tensor: Any, out: Any = None) -> None:
        """Start exchanging ``tensor`` (dense, or :class:`RowSparse`) under ``name``.

        ``out``: memory of the dense tensor's shape and dtype (its own, as Horovod's optimizer
        averages a gradient in place) that the result is written into, where nothing reads the
        tensor after its exchange (not while ``auto`` observes a step); else the result is new."""
        began = time.perf_counter()
        if not self.flights and not self.error_if_nonfinite:  # the step's first tensor
            self._undo = Undo()
        with undoable(self._undo):
            self._start(name, tensor, out)
        self.communicator.stats.seconds["start"] += time.perf_counter() - began

    def _start(self, name: str, tensor: Any, out: Any) -> None:
        if name in self.flights:
            raise RuntimeError(f"hvdsketch: {name!r} was started twice in one step")
        values = values_of(tensor)
        ops = backend(values)
        traced = self._traced = ops.is_symbolic(values)
        if not self.flights:  # the step's first tensor
            if not traced:
                self.protocol.begin(ops, self.step)
            if not traced and not self.error_if_nonfinite:  # (the step's old residuals live until it ends)
                self._before = self.table.snapshot()
            self.flights.begin(self._expected)
        dtype = ops.dtype_name(values)
        if traced or dtype in CARRIED_AS or self.policy.wants_inputs or isinstance(tensor, RowSparse):
            out = None
        if dtype in CARRIED_AS:
            self._carried[name] = dtype
            tensor = _with_values(tensor, ops.cast(values, CARRIED_AS[dtype]))
        shape = tensor.dense_shape if isinstance(tensor, RowSparse) else ops.shape(tensor)
        ctx = TensorContext(name, tuple(shape), 0 if traced else self.step, self.communicator.size,
                            self.communicator.rank, out, row_sparse=isinstance(tensor, RowSparse) and not traced)
        compressor = self._dense if is_passthrough(tensor) else self.policy.compressor(ctx)
        keep = compressor.overflows and self._before is not None  # to exchange it exactly if it overflows
        if keep and out is not None:
            out, ctx = None, dataclasses.replace(ctx, out=None)
        # whether this rank's own input was finite, if its result is not: asked of the input then,
        # or now where the result overwrites it
        overwritten = out is not None and ops.is_floating(values)
        self._given[name] = (_constant(ops.all_finite_flag(values)) if overwritten
                             else functools.partial(ops.all_finite_flag, values))
        memory = self.table.memory_for(compressor)
        if isinstance(tensor, RowSparse) and (self.sparse_as_dense or not compressor.row_sparse or (
                memory is not None and memory.keeps(name) and not memory.takes_rows(name))):
            tensor = tensor.to_dense()
        if keep:
            self._kept[name] = (tensor, ctx, compressor)
        if self.policy.wants_inputs:
            self._inputs.append((tensor, ctx))
        self.flights.progress()
        with self.placement(name):
            flight = Flight(compressor, tensor, ctx, memory, self.table.records)
            narrow = [ops.dtype_name(m.tensor) for m in flight.messages if ops.dtype_name(m.tensor) in NARROW]
            if narrow:
                self._narrow[name] = (narrow[0], str(compressor))
            self.flights.submit(name, flight)

    def complete(self, name: str) -> Any:
        """``name``'s averaged result now, its exchange driven to its end, for an adapter that hands
        each result on at once (FSDP's reduce-scatter, which reads it when the call returns); its
        rounds go in the order of these calls on every rank, so no :meth:`expect` order may be given.
        :meth:`finish` still ends the step: the step's checks, the bfloat16 casts, the policy."""
        began = time.perf_counter()
        with self.watchdog.watching(self._stalled):
            result = self.flights.complete(name)
        self._kept.pop(name, None)  # handed on: an overflow can no longer be exchanged again in its place
        self.communicator.stats.seconds["finish"] += time.perf_counter() - began
        return result

    def finish(self) -> dict[str, Any]:
        """Wait for every exchange started this step; their averaged results by name.

        Round ``k`` of every tensor still exchanging is waited for, then round ``k + 1`` of each
        started, so the rounds of multi-round methods travel together."""
        began = time.perf_counter()
        try:
            with self.watchdog.watching(self._stalled), undoable(self._undo):
                self.protocol.end(self.step)  # before any gradient: ranks of other setups start other collectives
                results = self.flights.wait_all()
            self.communicator.stats.seconds["codec"] += self.flights.codec_seconds()
            self.stood = True
            finite = self._check(results)  # (a traced step's stood is set there: a truth of each run)
            if not self._traced:
                self.stood = finite
            results.update({name: _cast(results[name], dtype) for name, dtype in self._carried.items()})
        finally:
            for kept in (self.flights, self._given, self._narrow, self._carried, self._kept):
                kept.clear()
            self._before = self._undo = None
        if self.op == "sum":
            results = {name: _scaled(r, self.communicator.size) for name, r in results.items()}
        self.communicator.stats.seconds["finish"] += time.perf_counter() - began
        inputs, self._inputs = self._inputs, []
        if not finite:  # left without trace: no decision, no step (alike on every rank)
            return results
        inputs.sort(key=lambda item: self.order.get(item[1].name, len(self.order)))
        self.policy.end_step(inputs, self.communicator)
        if not self._traced:  # a trace is no step: a rank that traces again would count one more
            self.step += 1
        return results

    def exchange(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """Start and finish one step of ``tensors`` at once (where no hook can start them earlier);
        an ordered communicator launches them in this order unless :meth:`expect` gave one."""
        expected = self._expected
        if expected is None:
            self._expected = list(tensors)
        try:
            for name, tensor in tensors.items():
                self.start(name, tensor)
            return self.finish()
        finally:
            self._expected = expected

    # -- inside a step ----------------------------------------------------------------------------

    def _stalled(self, waited: float) -> str:
        return (f"hvdsketch: rank {self.communicator.rank} has waited {int(waited)} s at step {self.step} for "
                f"{self.flights.waiting_for} (in flight: {', '.join(self.flights.names) or '-'}); another rank may not "
                f"have started the same exchanges (it stopped early, waits elsewhere, or runs another model)")

    def check_in(self, activity: int, share: bytes, ops: Ops) -> list[bytes] | None:
        """Between steps, every rank's ``share`` (:data:`~hvdsketch.exchange.agreement.CHECKPOINT`:
        its pickled state), or ``None``: never a wait on ranks that do not ask for it.

        The share travels with the step tag for ``activity``, in one round. Where every rank checks
        in alike, each gets every share. Where the others train on, their next step's tag meets this
        one and they answer with empty shares (:meth:`StepProtocol.settled
        <hvdsketch.exchange.protocol.StepProtocol.settled>`): ``None`` at once. Where they do
        something else (``hvd.barrier()``, an allreduce), ``None`` after ``protocol.checkin_seconds``; the
        round stays in flight until the others' next step answers it (or their own late check-in,
        which then gets every share), and this rank's next step waits for that first. Ranks at
        another step or setup raise on every rank; a communicator that matches collectives by call
        order (MPI) raises ``TimeoutError`` instead of giving up."""
        if self.flights or self.protocol.open:
            raise RuntimeError("hvdsketch: a step is under way (its gradients' exchanges have started); call "
                               "this after optimizer.step(), not between backward() and step()")
        return self.protocol.check_in(activity, share, ops, self.step)

    def abandon(self) -> None:
        """Forget a step broken off (a failed collective, Horovod elastic's reset): its exchanges and
        tag never finish; what the memory kept of it stays."""
        self.flights.clear()
        self._inputs.clear()
        self._kept.clear()
        self._before = self._undo = None
        self.protocol.abandon()

    def _check(self, results: dict[str, Any]) -> bool:
        """Whether every result is finite, in one host sync (eagerly). Where one is not: the same
        error on every rank (``error_if_nonfinite``), or the step's state put back as it was
        before it. Inside ``tf.function``: assertions that run with the step, or nothing."""
        floating = {name: values_of(r) for name, r in results.items()
                    if backend(values_of(r)).is_floating(values_of(r))}
        if not floating:
            return True
        ops = backend(next(iter(floating.values())))
        if ops.is_symbolic(next(iter(floating.values()))):
            if self.error_if_nonfinite:
                results.update({name: _with_values(r, ops.check_finite(values_of(r), self._nonfinite(name, None)))
                                for name, r in results.items() if name in floating})
            else:  # each run of the graph puts its held state back where an average is not finite
                flags = [ops.cast(ops.reshape(ops.all_finite_flag(v), (1,)), "int64") for v in floating.values()]
                self.stood = ops.reduce_min(ops.concat(flags)) > 0
                self._undo.revert_unless(self.stood)
            return True
        flags = [ops.all_finite_flag(r) for r in floating.values()]
        if self.error_if_nonfinite:
            if ops.all_true(flags):
                return True
            bad = _failing(floating, flags, ops)
            given = self._given.get(bad[0])
            finite_here = None if given is None else ops.all_true([given()])
            raise FloatingPointError(self._nonfinite(bad[0], finite_here)
                                     + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
        given = [self._given[name]() for name in floating]
        if ops.all_true(flags + given):  # one host sync, as the check's
            return True
        return self._without_trace(results, _failing(floating, flags, ops), _failing(floating, given, ops), ops)

    def _without_trace(self, results: dict[str, Any], averaged: list[str], inputs: list[str], ops: Ops) -> bool:
        """Where the averages of ``averaged`` (alike on every rank) or this rank's ``inputs`` are not
        finite: whether the step stands. A method's own overflow on gradients finite on every rank is
        exchanged again exactly (``results`` updated) and the step stands, those tensors' state as
        before it; else the step leaves no trace: its whole state is put back. A rank's non-finite
        input whose average is finite (a lossy method left it out) gets its residual back."""
        before = self._before
        if not averaged:
            self.table.restore(before, {name: _dense_shape(results[name], ops) for name in inputs}, records=False)
            return True
        elsewhere = set().union(*agreement.allgather_objects(  # (every rank is here: the averages are alike)
            self.communicator, sorted(set(averaged) & set(inputs)), f"{self.prefix}.nonfinite", ops))
        overflowed = [name for name in averaged if name not in elsewhere and name in self._kept]
        exact = self._exactly(overflowed) if overflowed else {}
        redone = [name for name, r in exact.items() if ops.all_true([ops.all_finite_flag(values_of(r))])]
        if set(averaged) - set(redone):  # a rank's gradient was not finite: the loss scaler's step
            self._undo.revert()
            self.table.restore(before)
            narrow = [name for name in averaged if name not in elsewhere and name in self._narrow]
            why = (f" ({narrow[0]!r} is finite on every rank: it overflowed {self._narrow[narrow[0]][0]} on the "
                   f"wire of {self._narrow[narrow[0]][1]})" if narrow else "")
            self._warn_once("nonfinite", f"the average of {_listed(averaged)} is NaN or Inf{why}; handed back as it "
                            f"is, as Horovod and DDP do, for a loss scaler to skip the step, with hvdsketch's state "
                            f"(residuals, compressors' state, decisions, the step) kept as it was before it")
            return False
        results.update(exact)
        self.table.restore(before, {name: _dense_shape(results[name], ops) for name in redone})
        methods = sorted({str(self._kept[name][2]) for name in redone})
        self._warn_once("overflow", f"{', '.join(methods)} overflowed on {_listed(redone)}, finite on every rank; "
                        f"exchanged exactly instead for this step, their state kept as it was before it")
        return True

    def _exactly(self, names: Sequence[str]) -> dict[str, Any]:
        """The exact averages of the kept inputs of ``names`` (the same names on every rank)."""
        exact = Scheduler(self.communicator, f"{self.prefix}.exact", self.placement)
        exact.begin(list(names))
        for name in names:
            tensor, ctx, _ = self._kept[name]
            with self.placement(name):
                exact.submit(name, Flight(self._rows if isinstance(tensor, RowSparse) else self._dense, tensor, ctx))
        return exact.wait_all()

    def _warn_once(self, kind: str, what: str) -> None:
        if self.communicator.rank == 0 and kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"hvdsketch: step {self.step}: {what} (warned once; error_if_nonfinite=True raises "
                          f"instead)", NonfiniteStep, stacklevel=5)

    def _nonfinite(self, name: str, finite_here: bool | None) -> str:
        return (nonfinite_message(repr(name), f"rank {self.communicator.rank}", finite_here,
                                  *self._narrow.get(name, (None, None)))
                + "; a loss scaler (PyTorch's GradScaler) skips such steps where error_if_nonfinite=False, "
                  "the default")

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self, residuals: bool = True) -> dict[str, Any]:
        """This rank's state: the step (it seeds the hashes), the policy's choices, the tensors'
        compressor states and the residuals, as numpy arrays and plain values. Only this rank's: a
        checkpoint of every rank gathers it from each (:func:`hvdsketch.exchange.checkpoint.gather`).
        Without ``residuals``, neither residuals nor compressor states: nothing read from a tensor
        (so a save Keras traces can take it)."""
        return {"step": self.step, "world": self.world, "policy": self.policy.state_dict(),
                **self.table.state_dict(residuals)}

    def load_state_dict(self, state: Mapping[str, Any], convert: Any) -> None:
        """Restore :meth:`state_dict`; ``convert(name, array)`` makes the tensor of each array.

        The step, the tensors' compressor states and both memories' residuals are replaced: what
        ``state`` leaves out starts afresh (so a state without them resets them). The policy (and the
        plan of a planned memory, with ``memory`` given without residuals) is restored where ``state``
        has it and left as it is where not."""
        if self.flights:
            raise RuntimeError("hvdsketch: cannot load state while exchanges are in flight")
        self.step = int(state["step"])
        self.world = state.get("world")
        if state.get("policy") is not None:
            self.policy.load_state_dict(state["policy"])
        self.table.load_state_dict(state, convert, create)


def _listed(names: Sequence[str], shown: int = 3) -> str:
    return ", ".join(map(repr, names[:shown])) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _dense_shape(result: Any, ops: Ops) -> tuple[int, ...]:
    return tuple(result.dense_shape) if isinstance(result, RowSparse) else ops.shape(result)


def _failing(named: Mapping[str, Any], flags: Sequence[Any], ops: Ops) -> list[str]:
    """The names of ``named`` whose finite flag is false."""
    return [name for name, flag in zip(named, flags) if not ops.all_true([flag])]


def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


def _with_values(result: Any, values: Any) -> Any:
    """``result`` (dense, or :class:`RowSparse`) with ``values`` in place of its values."""
    return RowSparse(result.indices, values, result.dense_shape) if isinstance(result, RowSparse) else values


def _cast(result: Any, dtype: str) -> Any:
    """``result`` (dense, or :class:`RowSparse`) with its values cast to ``dtype``."""
    values = values_of(result)
    return _with_values(result, backend(values).cast(values, dtype))


def _scaled(result: Any, factor: float) -> Any:
    return _with_values(result, values_of(result) * factor)
