"""What every compressor is: a round-based exchange of messages.

Following GRACE's split, a :class:`Compressor` only says what to send and how
to read what comes back; a communicator (:mod:`hvdsketch.collectives`) moves
the messages, and the exchanger (:mod:`hvdsketch.exchange`) runs error
feedback around it, in one place for every method::

    g, ctx = compressor.prepare(g, ctx)        # DGC: clipping and momentum; others: g
    g = memory.compensate(name, g)             # g + e
    rounds = compressor.exchange(g, ctx)       # the round generator below
    ... round.residual() -> memory.update(name, ...)

Most methods need one round (``compress -> reduce -> decompress``); PowerSGD
and the union methods need two, so the contract is a generator that yields a
:class:`Round` of messages at a time and receives their reductions::

    def exchange(self, tensor, ctx):
        messages, local = self.compress(tensor, ctx)
        reduced = yield Round(messages, residual=lambda: self.residual(tensor, messages, local, ctx))
        return self.decompress(reduced, local, ctx), ctx.state

The round whose messages settle what this rank sends carries ``residual``:
what those messages leave out of the tensor the exchange was given, computed
only when a residual memory keeps that tensor. The exchange returns the
averaged tensor and the tensor's next state record: compressors are stateless
values, and what a method remembers between steps (``State``) travels in the
context and back (:mod:`hvdsketch.compress.state`).
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Generator, Literal, Sequence

from hvdsketch import spec as _spec
from hvdsketch.compress.support import RowSparse

Op = Literal["average", "sum", "max", "allgather", "bor", "alltoall", "reduce_scatter"]


@dataclass(frozen=True)
class Message:
    """One tensor to reduce across ranks and how.

    ``average``: element-wise mean (Horovod's ``op=Average``); ``sum``: element-wise
    sum; ``max``: element-wise maximum; ``allgather``: rank-ordered concatenation
    along dimension 0, sizes may differ by rank; ``bor``: bitwise OR of ``uint8``; ``alltoall``:
    the vector cut into ``splits`` (host ints, one per rank in rank order), piece ``q`` sent to rank
    ``q``, and what every rank sent this one concatenated in rank order; ``reduce_scatter``: the
    element-wise mean of a tensor whose dimension 0 is cut into ``N`` equal blocks, rank ``q``
    receiving block ``q`` of it (FSDP's gradient reduction). Those two are the ops whose result
    differs by rank.
    """

    tensor: Any
    op: Op = "average"
    splits: tuple[int, ...] | None = None
    #: ``alltoall``: the rows every rank sends this one (host ints, in rank order), where every rank
    #: knows them before it sends (a reduce-scatter's equal blocks, or counts a round before brought);
    #: ``None``: the communicator learns them first.
    received: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Round:
    """The messages of one round of an exchange.

    ``residual``, on the round whose messages settle what this rank sends: a function
    giving what they leave out of the tensor the exchange was given (error feedback
    keeps it), or ``None`` from it when nothing is left out. It is called only when a
    residual memory keeps the tensor, after the round's collectives have started. An
    exchange none of whose rounds carries one leaves nothing out.
    """

    messages: list[Message]
    residual: Callable[[], Any] | None = None


#: An exchange: yields rounds, receives their reductions, returns ``(averaged tensor, next state)``.
Exchange = Generator[Round, "list[Any]", "tuple[Any, Any]"]


@dataclass(frozen=True)
class TensorContext:
    """What a compressor may know of a tensor besides its values."""

    name: str
    shape: tuple[int, ...]
    step: int = 0
    world_size: int = 1
    rank: int = 0
    #: Where the dense result goes: memory of the tensor's shape and dtype made once (the gradient's
    #: own), or ``None`` for a new tensor (TensorFlow). A decompress that makes a dense result writes
    #: into it (ops' ``out=``); the flight copies any other dense result there.
    out: Any = None
    #: The compressor's state record of this tensor as the last exchange left it (its ``State``;
    #: ``None`` for a method without state). A flight gives a stateful method its initial record
    #: where the caller gives none.
    state: Any = None
    #: Whether the gradient comes as rows (:class:`~hvdsketch.compress.support.RowSparse`) to an
    #: exchange outside a trace, so a row-sparse method can take it as it is.
    row_sparse: bool = False


class Compressor(ABC):
    """Base of all compressors; subclasses are dataclasses whose fields are the flag's options."""

    #: The name used in the compression flag.
    name: ClassVar[str]
    #: True when one ``average`` message of the tensor's dtype carries the whole
    #: exchange, so the compressor drops into Horovod's own ``compression=``.
    drop_in: ClassVar[bool] = False
    #: True when :meth:`compress` takes a :class:`~hvdsketch.compress.support.RowSparse` gradient
    #: as it is; the exchanger densifies such gradients for every other compressor.
    row_sparse: ClassVar[bool] = False
    #: True when error feedback is part of the method (EF-SignSGD, PowerSGD, DGC's accumulation):
    #: the exchanger keeps a float32 residual for it when the user gives no residual memory.
    feedback: ClassVar[bool] = False
    #: True when the exchange sizes its later rounds on the host from what earlier rounds brought
    #: (``balanced``'s splits), so it cannot be traced into a graph: TensorFlow runs it as one Python
    #: op inside ``tf.function``.
    host_sized: ClassVar[bool] = False
    #: True when the method's own arithmetic (norms, products, rescaled or summed values) can
    #: overflow the dtype on finite gradients whose dense average does not: the exchanger then keeps
    #: the gradient until the step ends, to exchange it exactly where that happened.
    overflows: ClassVar[bool] = False
    #: The frozen record of what the method remembers of a tensor between steps, or ``None``.
    State: ClassVar[type | None] = None

    def initial_state(self) -> Any:
        """A tensor's record before its first exchange (``None`` for a method without state)."""
        return None if self.State is None else self.State()

    def traceable(self) -> bool:
        """Whether the exchange can be traced once into a graph (``tf.function``) that runs it step
        after step without Python: not where it sizes rounds on the host (:attr:`host_sized`) or keeps
        state whose shape changes, or that only Python can advance. TensorFlow runs the others in
        Python ops inside ``tf.function``."""
        return not self.host_sized

    def held_state(self, record: Any, like: Any, ctx: TensorContext) -> Any:
        """``record`` with every array made that a traced graph keeps from its first run on (see
        :mod:`hvdsketch.compress.state`); ``like``: an eager tensor of the gradient's dtype and device."""
        return record

    def one_message(self) -> "Compressor":
        """This method in the form whose exchange is one averaged message (:attr:`drop_in`), for
        Horovod's ``compression=``; itself when it is that already (or has no such form)."""
        return self

    def prepare(self, tensor: Any, ctx: TensorContext) -> tuple[Any, TensorContext]:
        """The tensor that error feedback compensates and the context the exchange runs in: the
        gradient and ``ctx`` themselves, except for methods that transform the gradient first (DGC's
        clipping and momentum correction, whose momentum the context's state then carries)."""
        return tensor, ctx

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        """Yield each round's messages, receive their reductions, return the averaged tensor and the
        tensor's next state (here: ``ctx.state`` unchanged)."""
        messages, local = self.compress(tensor, ctx)
        reduced = yield Round(messages, lambda: self.residual(tensor, messages, local, ctx))
        return self.decompress(reduced, local, ctx), ctx.state

    def residual(self, tensor: Any, messages: Sequence[Message], local: Any, ctx: TensorContext) -> Any:
        """What ``messages`` leave out of ``tensor``: ``tensor - estimate``, dense (``None``: nothing)."""
        if isinstance(tensor, RowSparse):  # the estimate is dense
            tensor = tensor.to_dense()
        return tensor - self.estimate(messages, local, ctx)

    def estimate(self, messages: Sequence[Message], local: Any, ctx: TensorContext) -> Any:
        """What this rank's own messages carry, as a dense tensor: the reduction over one rank."""
        return self.decompress([m.tensor for m in messages], local, dataclasses.replace(ctx, world_size=1, out=None))

    @abstractmethod
    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        """The messages to send for ``tensor`` and what this rank keeps to decompress with."""

    @abstractmethod
    def decompress(self, reduced: Sequence[Any], local: Any, ctx: TensorContext) -> Any:
        """The averaged dense tensor from the reduced messages."""

    def __str__(self) -> str:
        return _spec.render(self)
