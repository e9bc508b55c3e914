"""One tensor's exchange, driven round by round; error feedback happens here and nowhere else.

A :class:`Flight` adds the memory's residual to the prepared gradient (``g + e``), steps the compressor's
rounds (:class:`~hvdsketch.compress.Round`) and, once the round that settles what this rank sends has
started, keeps what its messages leave out (``e = g + e - C(g + e)``).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from hvdsketch.compress.base import Compressor, Message, Round, TensorContext
from hvdsketch.compress.state import StateTable
from hvdsketch.compress.support import RowSparse, values_of
from hvdsketch.memory.residual import Memory
from hvdsketch.ops import backend


class Flight:
    """The exchange of one tensor by ``compressor``; ``memory`` keeps its residual (or ``None``).

    ``round`` is the round to send next and ``index`` its number; :meth:`advance` takes its reduction, until
    ``done``: then ``result`` is the average (in ``ctx.out`` when given) and ``state`` the next state record.
    ``states``: the table the record comes from where ``ctx.state`` is ``None`` and goes back to (traced: held
    there, :mod:`hvdsketch.compress.state`). ``seconds``: time in the compressor and memory, not in waits.
    """

    def __init__(self, compressor: Compressor, tensor: Any, ctx: TensorContext, memory: Memory | None = None,
                 states: StateTable | None = None) -> None:
        began = time.perf_counter()
        ops = backend(values_of(tensor))
        self._traced = ops.is_symbolic(values_of(tensor))
        if ctx.state is None and compressor.State is not None and states is not None and self._traced:
            with ops.outside_trace():  # a checkpoint's arrays, and the held memory, made eagerly
                like = ops.zeros((), ops.dtype_name(values_of(tensor)), values_of(tensor))
                record = compressor.held_state(states.get(ctx.name, compressor), like, ctx)
                ctx = dataclasses.replace(ctx, state=states.hold(ctx.name, compressor, record, ops))
        elif ctx.state is None and compressor.State is not None:
            ctx = dataclasses.replace(ctx, state=(states.get(ctx.name, compressor) if states is not None
                                                  else compressor.initial_state()))
        self.compressor, self._states, self._started_from = compressor, states, ctx.state
        self._memory = memory if memory is not None and memory.keeps(ctx.name) else None
        tensor, self.ctx = compressor.prepare(tensor, ctx)
        self.state: Any = self.ctx.state
        if self._memory is not None:
            tensor = self._memory.compensate(ctx.name, tensor)
        self._rounds = compressor.exchange(tensor, self.ctx)
        self.round: Round = next(self._rounds)
        self.index = 0
        self.done = False
        self.result: Any = None
        self.seconds = time.perf_counter() - began

    @property
    def messages(self) -> list[Message]:
        return self.round.messages

    def settle(self) -> None:
        """Keep the residual of the round just started, if it settles what this rank sends."""
        if self._memory is not None and self.round.residual is not None:
            began = time.perf_counter()
            residual = self.round.residual()
            if residual is not None:
                self._memory.update(self.ctx.name, residual)
            self.seconds += time.perf_counter() - began

    def advance(self, reduced: Sequence[Any]) -> bool:
        """Hand the current round's reduction to the compressor; True once the exchange is done."""
        began = time.perf_counter()
        try:
            self.round = self._rounds.send(list(reduced))
            self.index += 1
        except StopIteration as end:
            result, self.state = end.value
            self.result, self.done = _written(result, self.ctx.out), True
            if self._states is not None:
                self._states.put(self.ctx.name, self.compressor, self.state, traced=self._traced)
        self.seconds += time.perf_counter() - began
        return self.done

    def rewind(self) -> None:
        """Put back the record this exchange started from, as if it had not run (an eager step to skip)."""
        if self._states is not None and not self._traced:
            self._states.put(self.ctx.name, self.compressor, self._started_from)


def _written(result: Any, out: Any) -> Any:
    """The dense ``result`` in ``out`` when one is given; a row-sparse result as it is."""
    if out is None or isinstance(result, RowSparse):
        return result
    return backend(result).into(out, result)


def run_local(compressor: Compressor, tensor: Any, ctx: TensorContext, memory: Memory | None = None,
              states: StateTable | None = None) -> tuple[Any, list[list[Message]]]:
    """The whole exchange over this rank alone: the result and every round's messages. ``states``: the table
    the tensor's state comes from and goes back to (none: the initial state, dropped after)."""
    flight = Flight(compressor, tensor, ctx, memory, states)
    rounds = []
    while not flight.done:
        rounds.append(flight.messages)
        flight.settle()
        flight.advance([m.tensor for m in flight.messages])
    return flight.result, rounds
