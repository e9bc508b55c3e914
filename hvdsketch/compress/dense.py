"""Horovod's own two: no compression, and fp16 on the wire."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress.base import Compressor, Message, TensorContext
from hvdsketch.ops import backend


@dataclass(frozen=True)
class NoCompression(Compressor):
    """The dense tensor, averaged as it is (Horovod's ``Compression.none``).

    Host syncs: none.
    """

    name: ClassVar[str] = "none"
    drop_in: ClassVar[bool] = True

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        return [Message(tensor, "average")], None

    def decompress(self, reduced: Sequence[Any], state: Any, ctx: TensorContext) -> Any:
        return reduced[0]

    def residual(self, tensor: Any, messages: Sequence[Message], state: Any, ctx: TensorContext) -> None:
        """Nothing: the tensor travels whole."""
        return None


@dataclass(frozen=True)
class HalfPrecision(Compressor):
    """The tensor cast to 16-bit floats for the wire and back (Horovod's ``Compression.fp16``).

    Values beyond float16's range (65504) overflow to Inf on the wire; the exchange then raises,
    naming the overflow. ``dtype=bfloat16`` would keep fp32's range at fp16's size, but
    Horovod 0.28.1 reduces no bfloat16 tensor (PyTorch or TensorFlow, MPI, Gloo or NCCL), so it is
    refused when built rather than when the first gradient fails to travel.

    Host syncs: none.
    """

    name: ClassVar[str] = "fp16"
    drop_in: ClassVar[bool] = True

    dtype: str = "float16"

    def __post_init__(self) -> None:
        if self.dtype == "bfloat16":
            raise ValueError("dtype=bfloat16 cannot travel: Horovod 0.28.1 has no bfloat16 allreduce (PyTorch "
                             "or TensorFlow, CPU or GPU); use fp16 (float16), or keep the gradients float32")
        if self.dtype != "float16":
            raise ValueError(f"dtype must be float16 or bfloat16, got {self.dtype!r}")

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        return [Message(ops.cast(tensor, self.dtype), "average")], ops.dtype_name(tensor)

    def decompress(self, reduced: Sequence[Any], dtype: str, ctx: TensorContext) -> Any:
        ops = backend(reduced[0])
        return ops.cast(reduced[0], dtype) if ctx.out is None else ops.into(ctx.out, reduced[0])
