"""Horovod's own two: no compression, and fp16 on the wire."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.compress.state import scratch
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class NoCompression(Compressor):
    """The dense tensor, averaged as it is (Horovod's ``Compression.none``).

    Host syncs: none.
    """

    name: ClassVar[str] = "none"
    drop_in: ClassVar[bool] = True

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        return [Message(tensor, "average")], None

    def decompress(self, reduced: Sequence[Any], local: Any, ctx: TensorContext) -> Any:
        return reduced[0]

    def residual(self, tensor: Any, messages: Sequence[Message], local: Any, ctx: TensorContext) -> None:
        """Nothing: the tensor travels whole."""
        return None


@dataclass(frozen=True)
class HalfState:
    """What fp16 keeps of a tensor between steps: no state of the method, only its memory."""

    #: The 16-bit message, written into anew every step.
    wire: Any = scratch()


@dataclass(frozen=True)
class HalfPrecision(Compressor):
    """The tensor cast to 16-bit floats for the wire and back (Horovod's ``Compression.fp16``).

    Values beyond float16's range (65504) overflow to Inf on the wire; the exchange then raises, naming the
    overflow. ``dtype=bfloat16`` is refused: Horovod 0.28.1 reduces no bfloat16 tensor.

    Host syncs: none.
    """

    name: ClassVar[str] = "fp16"
    drop_in: ClassVar[bool] = True
    State: ClassVar[type] = HalfState

    dtype: str = "float16"

    def __post_init__(self) -> None:
        if self.dtype == "bfloat16":
            raise ValueError("dtype=bfloat16 cannot travel: Horovod 0.28.1 has no bfloat16 allreduce (PyTorch "
                             "or TensorFlow, CPU or GPU); use fp16 (float16), or keep the gradients float32")
        if self.dtype != "float16":
            raise ValueError(f"dtype must be float16 or bfloat16, got {self.dtype!r}")

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        messages, dtype = self.compress(tensor, ctx)
        reduced = yield Round(messages, lambda: self.residual(tensor, messages, dtype, ctx))
        ops = backend(tensor)
        kept = HalfState(messages[0].tensor) if ops.writable and not ops.is_symbolic(tensor) else ctx.state
        return self.decompress(reduced, dtype, ctx), kept

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        return [Message(self._wire(ops, tensor, ctx), "average")], ops.dtype_name(tensor)

    def _wire(self, ops: Ops, tensor: Any, ctx: TensorContext) -> Any:
        """``tensor`` in 16 bits, written into the state's message where it has its size and device."""
        wire = None if ctx.state is None else ctx.state.wire
        if (wire is None or ops.is_symbolic(tensor) or ops.shape(wire) != ops.shape(tensor)
                or ops.device_name(wire) != ops.device_name(tensor)):
            return ops.cast(tensor, self.dtype)
        return ops.into(wire, tensor)

    def decompress(self, reduced: Sequence[Any], dtype: str, ctx: TensorContext) -> Any:
        ops = backend(reduced[0])
        return ops.cast(reduced[0], dtype) if ctx.out is None else ops.into(ctx.out, reduced[0])
