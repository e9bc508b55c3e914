"""What every compressor is: a round-based exchange of messages.

As in GRACE, a :class:`Compressor` only says what to send and how to read what comes back; a communicator
(:mod:`hvdsketch.collectives`) moves the messages and the exchanger (:mod:`hvdsketch.exchange`) runs error feedback
around it. An exchange is a generator that yields a :class:`Round` of messages at a time, receives their
reductions, and returns the averaged tensor and the tensor's next state (:mod:`hvdsketch.compress.state`)::

    def exchange(self, tensor, ctx):
        messages, local = self.compress(tensor, ctx)
        reduced = yield Round(messages, residual=lambda: self.residual(tensor, messages, local, ctx))
        return self.decompress(reduced, local, ctx), ctx.state
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

    ``average``, ``sum``, ``max``: element-wise; ``allgather``: rank-ordered concatenation along dimension 0
    (sizes may differ by rank); ``bor``: bitwise OR of ``uint8``; ``alltoall``: piece ``q`` of the vector cut
    into ``splits`` (host ints, one a rank) sent to rank ``q``, what arrives concatenated in rank order;
    ``reduce_scatter``: rank ``q`` receives the mean of block ``q`` of ``N`` equal blocks along dimension 0.
    """

    tensor: Any
    op: Op = "average"
    splits: tuple[int, ...] | None = None
    #: ``alltoall``: the rows every rank sends this one (host ints, rank order), if known; ``None``: learnt first.
    received: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Round:
    """The messages of one round of an exchange.

    ``residual``, on the round whose messages settle what this rank sends: a function giving what they leave
    out of the exchange's tensor (``None``: nothing), called only where a residual memory keeps the tensor.
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
    #: Memory of the tensor's shape and dtype the dense result is written into, or ``None`` (a new tensor).
    out: Any = None
    #: The compressor's state record of this tensor as the last exchange left it (``None``: no state).
    state: Any = None
    #: Whether the gradient comes as :class:`~hvdsketch.compress.support.RowSparse` rows outside a trace.
    row_sparse: bool = False


class Compressor(ABC):
    """Base of all compressors; subclasses are dataclasses whose fields are the flag's options."""

    #: The name used in the compression flag.
    name: ClassVar[str]
    #: True when one ``average`` message of the tensor's dtype carries the exchange (Horovod's ``compression=``).
    drop_in: ClassVar[bool] = False
    #: True when :meth:`compress` takes a :class:`~hvdsketch.compress.support.RowSparse` gradient as it is.
    row_sparse: ClassVar[bool] = False
    #: True when error feedback is part of the method: the exchanger then keeps a residual even without memory.
    feedback: ClassVar[bool] = False
    #: True when later rounds are sized on the host from earlier ones, so the exchange cannot be traced.
    host_sized: ClassVar[bool] = False
    #: True when the method's arithmetic can overflow the dtype on finite gradients whose dense average does not.
    overflows: ClassVar[bool] = False
    #: The frozen record of what the method remembers of a tensor between steps, or ``None``.
    State: ClassVar[type | None] = None

    def initial_state(self) -> Any:
        """A tensor's record before its first exchange (``None`` for a method without state)."""
        return None if self.State is None else self.State()

    def traceable(self) -> bool:
        """Whether the exchange can be traced once into a graph (``tf.function``) that runs it every step
        (not where :attr:`host_sized`, or state that only Python can advance or whose shape changes)."""
        return not self.host_sized

    def held_state(self, record: Any, like: Any, ctx: TensorContext) -> Any:
        """``record`` with the arrays a traced graph keeps made (:mod:`hvdsketch.compress.state`), like ``like``."""
        return record

    def one_message(self) -> "Compressor":
        """This method in its one-averaged-message form (:attr:`drop_in`), else itself."""
        return self

    def prepare(self, tensor: Any, ctx: TensorContext) -> tuple[Any, TensorContext]:
        """The tensor error feedback compensates and the exchange's context: ``tensor`` and ``ctx`` unless the
        method transforms the gradient first (DGC)."""
        return tensor, ctx

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        """Yield each round's messages, receive their reductions, return the average and the next state."""
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
