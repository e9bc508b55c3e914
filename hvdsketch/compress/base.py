"""What every compressor is: a round-based exchange of messages.

Following GRACE's split, a :class:`Compressor` only says what to send and how
to read what comes back; a communicator (:mod:`hvdsketch.collectives`)
moves the messages, and a residual memory (:mod:`hvdsketch.memory`) adds
error feedback around it. Most methods need one round
(``compress -> reduce -> decompress``); methods such as PowerSGD need two, so
the contract is a generator that yields the messages of each round and
receives their reduction::

    def exchange(self, tensor, ctx):
        messages, state = self.compress(tensor, ctx)
        reduced = yield messages
        return self.decompress(reduced, state, ctx)

Drivers run all tensors' generators in lock step, so the messages of one
round travel in one fused collective per reduction op.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Generator, Literal, Mapping, Protocol, Sequence

Op = Literal["average", "max", "allgather", "bor"]
Exchange = Generator["list[Message]", "list[Any]", Any]


class ResidualMemory(Protocol):
    """Error-feedback state per tensor name (see :mod:`hvdsketch.memory`)."""

    def compensate(self, name: str, tensor: Any) -> Any: ...

    def update(self, name: str, compensated: Any, estimate: Any) -> None: ...


@dataclass(frozen=True)
class Message:
    """One tensor to reduce across ranks and how.

    ``average``: element-wise mean (Horovod's ``op=Average``); ``max``:
    element-wise maximum; ``allgather``: rank-ordered concatenation along
    dimension 0, sizes may differ by rank; ``bor``: bitwise OR of ``uint8``.
    """

    tensor: Any
    op: Op = "average"


@dataclass(frozen=True)
class TensorContext:
    """What a compressor may know of a tensor besides its values."""

    name: str
    shape: tuple[int, ...]
    step: int = 0
    world_size: int = 1
    rank: int = 0


class Compressor(ABC):
    """Base of all compressors; subclasses are dataclasses whose fields are the flag's options."""

    #: The name used in the compression flag.
    name: ClassVar[str]
    #: True when one ``average`` message of the tensor's dtype carries the whole
    #: exchange, so the compressor drops into Horovod's own ``compression=``.
    drop_in: ClassVar[bool] = False
    #: True when :meth:`compress` takes a :class:`~hvdsketch.compress.sketch.RowSparse` gradient
    #: as it is; drivers densify such gradients for every other compressor.
    row_sparse: ClassVar[bool] = False

    def exchange(self, tensor: Any, ctx: TensorContext, memory: "ResidualMemory | None" = None) -> Exchange:
        """Yield each round's messages, receive their reductions, return the averaged tensor.

        With a residual ``memory`` (error feedback, Seide et al. 2014; Karimireddy et al. 2019)
        the tensor is compensated first, ``g' = g + e``, and the memory keeps what this rank's
        messages failed to carry, ``e = g' - estimate(messages)``.
        """
        if memory is not None:
            tensor = memory.compensate(ctx.name, tensor)
        return (yield from self.send(tensor, ctx, memory))

    def send(self, tensor: Any, ctx: TensorContext, memory: "ResidualMemory | None" = None,
             **options: Any) -> Exchange:
        """The last round of :meth:`exchange`, for an already compensated ``tensor``; ``options``
        go to :meth:`compress` (what earlier rounds agreed on)."""
        messages, state = self.compress(tensor, ctx, **options)
        if memory is not None:
            memory.update(ctx.name, tensor, self.estimate(messages, state, ctx))
        reduced = yield messages
        return self.decompress(reduced, state, ctx)

    def estimate(self, messages: Sequence[Message], state: Any, ctx: TensorContext) -> Any:
        """What this rank's own messages carry, as a dense tensor: the reduction over one rank."""
        return self.decompress([m.tensor for m in messages], state, dataclasses.replace(ctx, world_size=1))

    @abstractmethod
    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        """The messages to send for ``tensor`` and the local state to decompress with."""

    @abstractmethod
    def decompress(self, reduced: Sequence[Any], state: Any, ctx: TensorContext) -> Any:
        """The averaged dense tensor from the reduced messages."""

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Per-tensor state kept between steps (PowerSGD's Q, DGC's velocity, residuals), as numpy
        arrays by field and tensor name; empty for stateless methods."""
        from hvdsketch.compress.state import export_state

        return export_state(self)

    def load_state_dict(self, state: Mapping[str, Mapping[str, Any]],
                        convert: "Callable[[str, Any], Any]") -> None:
        """Restore :meth:`state_dict`; ``convert(name, array)`` makes the back-end tensor of each array."""
        from hvdsketch.compress.state import import_state

        import_state(self, state, convert)

    def payload_bytes(self, messages: Sequence[Message]) -> int:
        """Bytes this rank contributes to the collectives for ``messages``."""
        from hvdsketch.ops import backend

        return sum(backend(m.tensor).nbytes(m.tensor) for m in messages)

    def __str__(self) -> str:
        opts = ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)  # type: ignore[arg-type]
                        if f.init and getattr(self, f.name) != f.default)
        return f"{self.name}:{opts}" if opts else self.name


def run(compressor: Compressor, tensor: Any, ctx: TensorContext, reduce) -> Any:
    """Drive one tensor's exchange to the end with ``reduce(messages) -> reduced``."""
    gen = compressor.exchange(tensor, ctx)
    messages = next(gen)
    while True:
        try:
            messages = gen.send(reduce(messages))
        except StopIteration as done:
            return done.value
