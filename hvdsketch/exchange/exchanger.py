"""The exchanger: every gradient's exchange starts when that gradient is ready; a step waits once.

The PyTorch optimizer calls :meth:`Exchanger.start` from each parameter's
gradient hook, while backward goes on, and :meth:`Exchanger.finish` before the
optimizer's step; the TensorFlow tape calls both for the gradients it computed.
``start`` asks the policy for the tensor's compressor (decided at the last step
boundary, never mid-step), starts a :class:`~hvdsketch.compress.flight.Flight`
(error feedback included) and sends its first round through the non-blocking
communicator; it also moves on every earlier tensor whose round has landed, so
multi-round methods advance while backward still runs (the step's flights are
the :mod:`~hvdsketch.exchange.scheduler`'s). ``finish`` first checks that every
rank is at the same step with the same setup (the step protocol,
:mod:`~hvdsketch.exchange.protocol`), then waits only for what is still in
flight, runs the last rounds, and checks in one host sync that every result is
finite: one rank's NaN or Inf reaches every rank's reduction, so every rank
raises alike and none is left waiting; each rank's message says whether its own
gradient was finite, so a finite gradient that overflowed a 16-bit wire dtype is
named as overflow. Training with a loss scaler (PyTorch's ``GradScaler``), whose
overflowing steps are expected and skipped, makes the exchanger with
``error_if_nonfinite=False``: a result that is not finite is then handed back as it
is, for the scaler to see and skip, and its tensor's residual and compressor state
start again, as at the first step, so no NaN outlives the skipped step (eager
steps; inside ``tf.function`` a NaN still fails its assertion). Then, at the step
boundary, the policy may look at the step's gradients and decide for the next
steps (``auto``).

A wait that lasts ``HVDSKETCH_STALL_SECONDS`` (default: Horovod's
``HOROVOD_STALL_CHECK_TIME_SECONDS``, 60) is reported on that
rank with what it waits for, every as many seconds until it ends, and ends the
job after Horovod's ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` where that is set
(:mod:`~hvdsketch.exchange.watchdog`).

Inside ``tf.function`` a step is fixed when the function is traced, and a rank
may trace again when another does not (a smaller last batch): there every
tensor's context has step 0 (so the ranks' hash seeds agree whichever graph each
runs), a trace does not count as a step, and no step tag is sent (its constant
input would let TensorFlow fold the collective into the graph, leaving a
retraced rank alone in it); the setup was agreed eagerly when first traced.
Horovod reduces no bfloat16 tensor, so bfloat16 gradients are exchanged as
float32 and handed back as bfloat16. An adapter that gives a tensor's own memory
(``start(..., out=)``: PyTorch's optimizer, as Horovod's averages ``.grad`` in
place) gets the result written there, with no dense tensor allocated per step.

A communicator that matches collectives by the order of calls rather than by
name (``communicator.ordered``: the MPI layer) gets its rounds in one canonical
order on every rank (:mod:`~hvdsketch.exchange.ordering`, kept by the scheduler): the adapter names
the tensors of a step with :meth:`Exchanger.expect` (``exchange`` names its
own), and a round waits in a queue until every round before it in that order
has been launched.

Compressors are stateless values; what a method remembers of a tensor (PowerSGD's
Q, DGC's momentum, the sketch's sizing) is a record in the exchanger's one
:class:`~hvdsketch.compress.state.StateTable` (``states``): a flight starts
from its tensor's record and puts the next one back when its exchange ends; a
trace reads the table and keeps nothing. Checkpoints
(:mod:`~hvdsketch.exchange.checkpoint`): :meth:`Exchanger.state_dict` is this
rank's state, that table included; the adapters gather every rank's into one
checkpoint.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
from typing import Any, Callable, ContextManager, Literal, Mapping, Sequence

from hvdsketch.collectives import Communicator
from hvdsketch.compress import Compressor, RowSparse, TensorContext, create
from hvdsketch.compress.flight import Flight
from hvdsketch.compress.state import StateTable
from hvdsketch.compress.support import is_passthrough, values_of
from hvdsketch.exchange import agreement
from hvdsketch.exchange.diagnosis import CARRIED_AS, NARROW, nonfinite_message
from hvdsketch.exchange.protocol import StepProtocol
from hvdsketch.exchange.scheduler import Scheduler
from hvdsketch.exchange.watchdog import Watchdog, report_seconds, shutdown_seconds
from hvdsketch.memory import Fp32, Memory
from hvdsketch.ops import backend

Reduction = Literal["average", "sum"]


class NonfiniteStep(UserWarning):
    """A step whose average was NaN or Inf, handed back (``error_if_nonfinite=False``)."""


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
        error_if_nonfinite: raise ``FloatingPointError`` on every rank when a result is NaN or Inf
            (the default); ``False`` hands it back and restarts its tensor's state (eager steps).
    """

    def __init__(self, policy: Any, communicator: Communicator, memory: Memory | None = None,
                 op: Reduction = "average", sparse_as_dense: bool = False, prefix: str = "hvdsketch",
                 placement: Callable[[str], ContextManager] | None = None, error_if_nonfinite: bool = True) -> None:
        if op not in ("average", "sum"):
            raise ValueError(f"hvdsketch: op must be average or sum, got {op!r}")
        if not isinstance(error_if_nonfinite, bool):
            raise TypeError(f"hvdsketch: error_if_nonfinite must be True or False, got {error_if_nonfinite!r}")
        self.policy, self.communicator, self.memory = policy, communicator, memory
        self.op, self.sparse_as_dense, self.prefix = op, sparse_as_dense, prefix
        self.placement = placement or (lambda name: contextlib.nullcontext())
        self.error_if_nonfinite = error_if_nonfinite
        self.step = 0
        #: The number of ranks this rank's state was made with (set when the ranks agree,
        #: :mod:`~hvdsketch.exchange.checkpoint`), ``None`` before.
        self.world: int | None = None
        #: Residuals of the methods whose error feedback is their own, when ``memory`` is ``None``.
        self.own_memory = Memory(default=Fp32(), spec="fp32")
        #: Each tensor's compressor state (PowerSGD's Q, the sketch's sizing), by name.
        self.states = StateTable()
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

    # -- setup ------------------------------------------------------------------------------------

    def verify(self, tensors: Sequence[agreement.Tensor], ops: Any) -> None:
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
            self.flights.begin(self._expected)
        dtype = ops.dtype_name(values)
        if traced or dtype in CARRIED_AS or self.policy.wants_inputs or isinstance(tensor, RowSparse):
            out = None
        # whether this rank's own input was finite, if its result is not: asked of the input then,
        # or now where the result overwrites it
        overwritten = out is not None and ops.is_floating(values)
        self._given[name] = (_constant(ops.all_finite_flag(values)) if overwritten
                             else functools.partial(ops.all_finite_flag, values))
        if dtype in CARRIED_AS:
            self._carried[name] = dtype
            tensor = _with_values(tensor, ops.cast(values, CARRIED_AS[dtype]))
        shape = tensor.dense_shape if isinstance(tensor, RowSparse) else ops.shape(tensor)
        ctx = TensorContext(name, tuple(shape), 0 if traced else self.step, self.communicator.size,
                            self.communicator.rank, out, row_sparse=isinstance(tensor, RowSparse) and not traced)
        compressor = self._dense if is_passthrough(tensor) else self.policy.compressor(ctx)
        memory = self._memory_for(compressor)
        if isinstance(tensor, RowSparse) and (self.sparse_as_dense or not compressor.row_sparse or (
                memory is not None and memory.keeps(name) and not memory.takes_rows(name))):
            tensor = tensor.to_dense()
        if self.policy.wants_inputs:
            self._inputs.append((tensor, ctx))
        self.flights.progress()
        with self.placement(name):
            flight = Flight(compressor, tensor, ctx, memory, self.states)
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
        self.communicator.stats.seconds["finish"] += time.perf_counter() - began
        return result

    def finish(self) -> dict[str, Any]:
        """Wait for every exchange started this step; their averaged results by name.

        Round ``k`` of every tensor still exchanging is waited for, then round ``k + 1`` of each
        started, so the rounds of multi-round methods travel together."""
        began = time.perf_counter()
        try:
            with self.watchdog.watching(self._stalled):
                self.protocol.end(self.step)  # before any gradient: ranks of other setups start other collectives
                results = self.flights.wait_all()
            self.communicator.stats.seconds["codec"] += self.flights.codec_seconds()
            results = self._check(results)
            results.update({name: _cast(results[name], dtype) for name, dtype in self._carried.items()})
        finally:
            for kept in (self.flights, self._given, self._narrow, self._carried):
                kept.clear()
        if self.op == "sum":
            results = {name: _scaled(r, self.communicator.size) for name, r in results.items()}
        self.communicator.stats.seconds["finish"] += time.perf_counter() - began
        inputs, self._inputs = self._inputs, []
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

    def _memory_for(self, compressor: Compressor) -> Memory | None:
        if self.memory is not None:
            return self.memory
        return self.own_memory if compressor.feedback else None

    def _stalled(self, waited: float) -> str:
        return (f"hvdsketch: rank {self.communicator.rank} has waited {int(waited)} s at step {self.step} for "
                f"{self.flights.waiting_for} (in flight: {', '.join(self.flights.names) or '-'}); another rank may not "
                f"have started the same exchanges (it stopped early, waits elsewhere, or runs another model)")

    def check_in(self, activity: int, share: bytes, ops: Any) -> list[bytes] | None:
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
        self.protocol.abandon()

    def _check(self, results: dict[str, Any]) -> dict[str, Any]:
        """Every result finite, else the same error on every rank: one host sync eagerly; inside
        ``tf.function``, assertions that run with the step."""
        floating = {name: values_of(r) for name, r in results.items()
                    if backend(values_of(r)).is_floating(values_of(r))}
        if not floating:
            return results
        ops = backend(next(iter(floating.values())))
        if ops.is_symbolic(next(iter(floating.values()))):
            return {name: _with_values(r, ops.check_finite(values_of(r), self._nonfinite(name, None)))
                    if name in floating else r for name, r in results.items()}
        flags = [ops.all_finite_flag(r) for r in floating.values()]
        if not self.error_if_nonfinite:
            self._restart(results, floating, flags, ops)
            return results
        if ops.all_true(flags):
            return results
        bad = _failing(floating, flags, ops)
        given = self._given.get(bad[0])
        finite_here = None if given is None else ops.all_true([given()])
        raise FloatingPointError(self._nonfinite(bad[0], finite_here)
                                 + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))

    def _restart(self, results: Mapping[str, Any], floating: Mapping[str, Any], flags: list[Any], ops: Any) -> None:
        """``error_if_nonfinite=False``: a tensor whose average is not finite (alike on every rank)
        starts its compressor state and residual again; one whose input was not finite on this rank
        though its average is (a lossy method left the value out), its residual."""
        given = [self._given[name]() for name in floating]
        if ops.all_true(flags + given):  # one host sync, as the check's
            return
        averaged, inputs = set(_failing(floating, flags, ops)), set(_failing(floating, given, ops))
        for name in averaged:
            self.states.forget(name)
        for name in averaged | inputs:
            result = results[name]
            shape = result.dense_shape if isinstance(result, RowSparse) else ops.shape(result)
            for memory in (self.memory, self.own_memory):
                if memory is not None:
                    memory.forget(name, shape)
        warnings.warn(f"hvdsketch: step {self.step} on rank {self.communicator.rank}: "
                      f"{', '.join(map(repr, sorted(averaged | inputs)))} not finite; handed back as they are "
                      f"(error_if_nonfinite=False: a loss scaler skips the step), their residuals and "
                      f"compressor state start again", NonfiniteStep, stacklevel=3)

    def _nonfinite(self, name: str, finite_here: bool | None) -> str:
        return (nonfinite_message(repr(name), f"rank {self.communicator.rank}", finite_here,
                                  *self._narrow.get(name, (None, None)))
                + "; where a loss scaler skips such steps (PyTorch's GradScaler), make the optimizer or the "
                  "DDP hook's state with error_if_nonfinite=False")

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self, residuals: bool = True) -> dict[str, Any]:
        """This rank's state: the step (it seeds the hashes), the policy's choices, the tensors'
        compressor states and the residuals, as numpy arrays and plain values. Only this rank's: a
        checkpoint of every rank gathers it from each (:func:`hvdsketch.exchange.checkpoint.gather`).
        Without ``residuals``, neither residuals nor compressor states: nothing read from a tensor
        (so a save Keras traces can take it)."""
        return {"step": self.step, "world": self.world, "policy": self.policy.state_dict(),
                "states": self.states.state_dict() if residuals else {},
                "memory": None if self.memory is None else self.memory.state_dict(residuals),
                "own_memory": self.own_memory.state_dict(residuals)}

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
        self.states.load_state_dict(state.get("states") or {}, convert, create)
        for memory, key in ((self.memory, "memory"), (self.own_memory, "own_memory")):
            if memory is not None:
                memory.load_state_dict(state.get(key) or memory.state_dict(residuals=False))


def _failing(named: Mapping[str, Any], flags: Sequence[Any], ops: Any) -> list[str]:
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
