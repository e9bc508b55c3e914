"""Any one-message compressor as a Horovod ``Compressor`` (``compress``/``decompress``).

Horovod's optimizers call ``compress(tensor) -> (tensor, ctx)``, average the
returned tensor across ranks, then call ``decompress(tensor, ctx)``. This
class runs a compressor's exchange inside that contract, so it can be passed
as ``compression=`` to ``hvd.DistributedOptimizer`` or
``hvd.DistributedGradientTape`` unchanged. Around the compressor it adds:

* pass-through for integer and empty tensors (nothing to compress);
* a check after the reduction, on every rank alike, that the result is
  finite: one rank's NaN or Inf reaches every rank's sum, so every rank raises;
* two small tags ``t, t^2`` appended to 32/64-bit payloads, ``t`` derived
  from the tensor's shape and the compressor's spec. If all ranks agree, the
  averages are ``t`` and ``t^2``; otherwise their variance is non-zero and
  every rank raises, instead of Horovod silently averaging unlike tensors;
* a count of payload bytes sent against the dense bytes, :meth:`report`.

Horovod's drop-in path shows neither the tensor's name nor the step. The
object infers both, alike on every rank: a step is a run of ``compress`` calls
(Horovod compresses every gradient of a step before it decompresses any), so a
``compress`` after a ``decompress`` starts the next step; within a step the
``k``-th tensor of a shape is named ``shape(...)#k`` (ranks produce their
gradients of one shape in the same order). So hash seeds change every step and
tensors of one shape keep their own state (the sketch's planned size: an
embedding and an output layer of one shape are sized apart). Inside
``tf.function`` the call is traced once, so the traced graph keeps the step
and plan of its tracing.
"""
from __future__ import annotations

import zlib
from typing import Any

from hvdsketch.compress import Compressor, TensorContext, create
from hvdsketch.exchange.flight import Flight
from hvdsketch.ops import backend

_TAGGED = ("float32", "float64")
_TAG_RTOL = 1e-5


def _tag(shape: tuple[int, ...], spec_digest: int) -> int:
    return (zlib.crc32(repr(shape).encode()) ^ spec_digest) % 15 + 1


class DropInCompression:
    """Horovod's compression interface around a :class:`~hvdsketch.compress.Compressor`."""

    def __init__(self, compressor: "Compressor | str") -> None:
        self.compressor = create(compressor).one_message()
        if not self.compressor.drop_in:
            raise ValueError(
                f"hvdsketch: {str(self.compressor)!r} needs more than one averaged allreduce, so it cannot "
                f"go into Horovod's compression= argument; use hvdsketch's DistributedOptimizer / "
                f"DistributedGradientTape with compression={str(self.compressor)!r}")
        self._digest = zlib.crc32(str(self.compressor).encode())
        self.step = 0
        self._of_shape: dict[tuple[int, ...], int] = {}  # shape -> tensors of it compressed this step
        self._decompressed = False  # since the last compress: the next compress starts a step
        self.bytes_sent = 0
        self.bytes_dense = 0

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        ops = backend(tensor)
        shape = ops.shape(tensor)
        if not ops.is_floating(tensor) or 0 in shape:
            return tensor, None
        if self._decompressed:
            self.step, self._decompressed = self.step + 1, False
            self._of_shape.clear()
        k = self._of_shape.get(shape, 0)
        self._of_shape[shape] = k + 1
        ctx = TensorContext(name=f"shape{shape}#{k}", shape=shape, step=self.step)
        flight = Flight(self.compressor, tensor, ctx)
        (message,) = flight.messages
        payload = message.tensor
        dtype = ops.dtype_name(payload)
        if dtype in _TAGGED:
            t = _tag(shape, self._digest)
            payload = ops.concat([ops.flatten(payload), ops.constant([t, t * t], dtype, tensor)])
        self._count(ops.nbytes(payload), ops.nbytes(tensor))
        return payload, (flight, ctx, ops.shape(message.tensor), dtype)

    def decompress(self, tensor: Any, state: Any) -> Any:
        self._decompressed = True
        if state is None:
            return tensor
        flight, ctx, message_shape, dtype = state
        ops = backend(tensor)
        tensor = ops.check_finite(tensor, f"hvdsketch: a gradient of shape {ctx.shape} is NaN or Inf on some rank")
        if dtype in _TAGGED:
            body, tags = ops.split(tensor, [ops.shape(tensor)[0] - 2, 2])
            t = _tag(ctx.shape, self._digest)
            ops.check_close(tags, ops.constant([t, t * t], dtype, tensor), _TAG_RTOL,
                            f"hvdsketch: ranks disagree on a gradient's shape or compression spec "
                            f"(this rank: shape {ctx.shape}, {self.compressor})")
            tensor = ops.reshape(body, message_shape)
        if flight.advance([tensor]):
            return flight.result
        raise RuntimeError(f"hvdsketch: {self.compressor.name} asked for a second round in the drop-in path")

    def _count(self, sent: int, dense: int) -> None:
        self.bytes_sent += sent
        self.bytes_dense += dense

    def report(self) -> dict[str, float]:
        """Bytes sent and their dense equivalent since construction."""
        sent, dense = int(self.bytes_sent), int(self.bytes_dense)
        return {"compression": str(self.compressor), "bytes_sent": sent, "bytes_dense": dense,
                "ratio": dense / sent if sent else float("nan")}

    def __repr__(self) -> str:
        return f"DropInCompression({str(self.compressor)!r})"


class _Preset:
    """A class attribute that yields a fresh drop-in compression per access (``Compression.fp16``)."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __get__(self, obj: Any, owner: type) -> DropInCompression:
        return owner.drop_in(self.flag)


class CompressionNamespace:
    """Horovod's ``Compression`` namespace, extended with every drop-in hvdsketch compressor."""

    drop_in: type[DropInCompression] = DropInCompression
    none = _Preset("none")
    fp16 = _Preset("fp16")

    @classmethod
    def from_spec(cls, flag: str) -> DropInCompression:
        """Any drop-in compressor by its flag, e.g. ``"sketch:error=0.5,rows=3"``."""
        return cls.drop_in(flag)

    @classmethod
    def sketch(cls, **options: Any) -> DropInCompression:
        """The sparse-sketch; options as in :class:`hvdsketch.compress.sketch.SparseSketch`, its
        bitmap riding in the averaged message. Each shape's first exchange is dense (or sized from
        ``density=``), later ones sized from the union the previous one showed."""
        return cls.drop_in(create("sketch", **options))
