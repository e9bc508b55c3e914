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

    ``dtype=bfloat16`` keeps fp32's range at fp16's size.

    Host syncs: none.
    """

    name: ClassVar[str] = "fp16"
    drop_in: ClassVar[bool] = True

    dtype: str = "float16"

    def __post_init__(self) -> None:
        if self.dtype not in ("float16", "bfloat16"):
            raise ValueError("dtype must be float16 or bfloat16")

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], Any]:
        ops = backend(tensor)
        return [Message(ops.cast(tensor, self.dtype), "average")], ops.dtype_name(tensor)

    def decompress(self, reduced: Sequence[Any], dtype: str, ctx: TensorContext) -> Any:
        return backend(reduced[0]).cast(reduced[0], dtype)
