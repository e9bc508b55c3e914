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

import dataclasses
import zlib
from typing import Any

from hvdsketch.compress import REGISTRY, Compressor, TensorContext, create
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


#: Options that make a compressor drop-in where its own defaults do not: the sketch's size fixed in
#: advance (a bound on the fraction of rows non-zero across all ranks), unless ``density`` or
#: ``ratio`` is given.
DROP_IN_DEFAULTS: dict[str, dict[str, Any]] = {"sketch": {"density": 0.05}}


class PresetCompression(DropInCompression):
    """A drop-in compression a ``Compression`` namespace made; called with options it gives the
    namespace's one with those options changed (``Compression.sketch(error=0.5)``)."""

    #: The namespace that made it.
    namespace: type["CompressionNamespace"]

    def __call__(self, **options: Any) -> "PresetCompression":
        current = {f.name: getattr(self.compressor, f.name) for f in dataclasses.fields(self.compressor)  # type: ignore[arg-type]
                   if f.init}
        return self.namespace.with_options(self.compressor.name, **{**current, **options})


class _Preset:
    """A compressor's name as an attribute of a ``Compression`` namespace (``Compression.fp16``).

    Reading it gives the namespace's one drop-in compression of that compressor with its drop-in
    defaults (the same object every time, so its :meth:`DropInCompression.report` accumulates);
    calling that with options gives the one of those options (``Compression.sketch(error=0.5)``).
    A compressor that needs more than Horovod's one averaged allreduce raises ``ValueError`` on
    reading, naming hvdsketch's own optimizer or tape, which runs it.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type["CompressionNamespace"]) -> "PresetCompression":
        return owner.with_options(self.name)


class CompressionNamespace:
    """Horovod's ``Compression`` namespace with every hvdsketch compressor by name.

    ``Compression.none`` and ``Compression.fp16`` as in Horovod; ``Compression.randomk``,
    ``Compression.sketch`` and every other drop-in compressor the same way, called with options
    for other settings (``Compression.sketch(error=0.5, rows=3)``, ``Compression.fp16(dtype="bfloat16")``),
    or by flag with :meth:`from_spec`. One object per namespace and flag: ``Compression.fp16 is
    Compression.fp16``. Horovod's path has room for one allreduce only, so the sketch's union bound
    is fixed in advance there: ``density`` defaults to 0.05 (:data:`DROP_IN_DEFAULTS`). The other compressors (``Compression.topk``, ``Compression.powersgd``, ...) raise a
    ``ValueError`` naming :attr:`own`, hvdsketch's optimizer or tape that runs them.
    """

    #: The drop-in compression class of the framework.
    drop_in: type[PresetCompression] = PresetCompression
    #: What runs the compressors Horovod's ``compression=`` cannot, for the error message.
    own: str = "hvdsketch's DistributedOptimizer / DistributedGradientTape"
    _made: dict[tuple[type, str], PresetCompression] = {}  # (namespace, flag) -> its one compression

    @classmethod
    def from_spec(cls, flag: "str | Compressor") -> PresetCompression:
        """The drop-in compression of a flag, e.g. ``"sketch:error=0.5"`` (``density=0.05`` unless given)."""
        compressor = create(flag)
        if not compressor.drop_in and compressor.name in DROP_IN_DEFAULTS:
            compressor = dataclasses.replace(compressor, **DROP_IN_DEFAULTS[compressor.name])
        if not compressor.drop_in:
            raise ValueError(
                f"hvdsketch: {str(compressor)!r} needs more than one averaged allreduce, so it cannot go into "
                f"Horovod's compression= argument; use {cls.own} with compression={str(compressor)!r}"
                + (", or fix the sketch's size with density= (e.g. sketch:density=0.05)"
                   if compressor.name == "sketch" else ""))
        key = (cls, str(compressor))
        if key not in cls._made:
            made = cls._made[key] = cls.drop_in(compressor)
            made.namespace = cls
        return cls._made[key]

    @classmethod
    def with_options(cls, name: str, **options: Any) -> PresetCompression:
        """The drop-in compression of compressor ``name`` with ``options`` (validated)."""
        return cls.from_spec(create(name, **options))


for _name in REGISTRY:
    setattr(CompressionNamespace, _name, _Preset(_name))
