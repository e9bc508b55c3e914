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

Horovod's drop-in path shows neither the tensor's name nor the step, so hash
seeds come from the base seed and the shape.
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
        self.compressor = create(compressor)
        if not self.compressor.drop_in:
            raise ValueError(
                f"hvdsketch: {str(self.compressor)!r} needs more than one averaged allreduce, so it cannot "
                f"go into Horovod's compression= argument; use hvdsketch's DistributedOptimizer / "
                f"DistributedGradientTape with compression={str(self.compressor)!r}"
                + (", or fix the sketch's size with density= (e.g. sketch:density=0.05)"
                   if self.compressor.name == "sketch" else ""))
        self._digest = zlib.crc32(str(self.compressor).encode())
        self.bytes_sent = 0
        self.bytes_dense = 0

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        ops = backend(tensor)
        shape = ops.shape(tensor)
        if not ops.is_floating(tensor) or 0 in shape:
            return tensor, None
        ctx = TensorContext(name=f"shape{shape}", shape=shape)
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
        """The averaged gradient, after checking (one host sync per tensor: Horovod's path has no
        step boundary to check all tensors at once) that it is finite and the tags agreed."""
        if state is None:
            return tensor
        flight, ctx, message_shape, dtype = state
        ops = backend(tensor)
        nonfinite = f"hvdsketch: a gradient of shape {ctx.shape} is NaN or Inf on some rank"
        disagree = (f"hvdsketch: ranks disagree on a gradient's shape or compression spec "
                    f"(this rank: shape {ctx.shape}, {self.compressor})")
        agreed = None
        if dtype in _TAGGED:
            body, tags = ops.split(tensor, [ops.shape(tensor)[0] - 2, 2])
            t = _tag(ctx.shape, self._digest)
            want = ops.constant([t, t * t], dtype, tensor)
            agreed = ops.reduce_min(ops.cast(abs(tags - want) <= _TAG_RTOL * abs(want), "int64")) > 0
            tensor = ops.reshape(body, message_shape)
        if ops.is_symbolic(tensor):  # inside tf.function: assertions that run with the step
            tensor = ops.check_finite(tensor, nonfinite)
            if agreed is not None:
                ops.check_true(agreed, disagree)
        else:
            finite = ops.all_finite_flag(tensor)
            if not ops.all_true([finite] + ([agreed] if agreed is not None else [])):
                if not ops.all_true([finite]):
                    raise FloatingPointError(nonfinite)
                raise ValueError(disagree)
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
        """The sparse-sketch; options as in :class:`hvdsketch.compress.sketch.SparseSketch`.
        Horovod's path has room for one allreduce, so the union bound is fixed in advance:
        ``density`` defaults to 0.05 here (the fraction of rows non-zero across all ranks)."""
        return cls.drop_in(create("sketch", **{"density": 0.05, **options}))
