"""Any one-message compressor as a Horovod ``Compressor`` (``compress``/``decompress``).

:class:`DropInCompression` runs a compressor's exchange inside Horovod's contract (``compress``, average,
``decompress``), so it can be passed as ``compression=`` to ``hvd.DistributedOptimizer`` or
``hvd.DistributedGradientTape``. Around the compressor it adds:

* pass-through for integer and empty tensors;
* a check, alike on every rank, that the average is finite: one that is not is handed back as Horovod
  hands it back, for a loss scaler to skip, the tensor's state left as before (warned once);
* tags ``t_i, t_i^2`` appended to 32/64-bit payloads (three 7-bit ``t_i`` from a digest of the shape and
  the spec): their averages are ``t_i`` and ``t_i^2`` only if all ranks agree, else every rank raises;
* bfloat16 tensors, which Horovod cannot reduce, carried as float32;
* a count of payload bytes sent against the dense bytes, :meth:`DropInCompression.report`.

Horovod's path shows neither the tensor's name nor the step, so the object (its :class:`Session`) infers
both alike on every rank: a ``compress`` after a ``decompress`` starts a step, and within a step the
``k``-th tensor of a shape is ``shape(...)#k``. Inside ``tf.function`` a trace is no step: the graph keeps
its tracing's step-0 hashes, so a rank that traces again alone builds the graph the others run.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from hvdsketch import spec as _spec
from hvdsketch.compress import REGISTRY, Compressor, TensorContext, create
from hvdsketch.exchange.flight import Flight
from hvdsketch.compress.state import StateTable, Undo, undoable
from hvdsketch.compress.support import is_passthrough
from hvdsketch.digests import digest
from hvdsketch.exchange.diagnosis import CARRIED_AS, NARROW, NonfiniteStep, nonfinite_message
from hvdsketch.ops import backend

_TAGGED = ("float32", "float64")
#: A rank's mismatch moves a tag's average by >= 1 / (N t) >= 1 / (1024 * 127) of it; rounding, below 1e-6.
_TAG_RTOL = 1e-6


def _tags(shape: tuple[int, ...], compressor: str) -> list[float]:
    """``t_1, t_1^2, t_2, t_2^2, t_3, t_3^2`` of three 7-bit tags (1..128) from a digest of shape and flag."""
    bits = digest(f"{shape}|{compressor}", bits=21)
    tags = [(bits >> (7 * i)) % 128 + 1 for i in range(3)]
    return [float(v) for t in tags for v in (t, t * t)]


def one_message(flag: "Compressor | str", own: str = "hvdsketch's DistributedOptimizer / DistributedGradientTape"
                ) -> Compressor:
    """The compressor ``flag`` names in its one-message form, or an error naming ``own``, what runs it instead."""
    if isinstance(flag, str) and _spec.Spec.parse(flag).name == "auto":
        raise _spec.SpecError(f"hvdsketch: auto chooses a compressor per tensor and step, which Horovod's "
                              f"compression= cannot carry; use it with {own} (compression='auto')")
    compressor = create(flag).one_message()
    if not compressor.drop_in:
        raise ValueError(f"hvdsketch: {str(compressor)!r} needs more than one averaged allreduce, so it cannot go "
                         f"into Horovod's compression= argument; use {own} with compression={str(compressor)!r}")
    return compressor


@dataclasses.dataclass
class Session:
    """What a drop-in compression remembers between calls: its inferred step and its tensors' states."""

    step: int = 0
    #: shape -> tensors of it compressed this step (the ``k`` of ``shape(...)#k``).
    of_shape: dict[tuple[int, ...], int] = dataclasses.field(default_factory=dict)
    #: Whether a decompress came since the last compress: the next compress starts a step.
    decompressed: bool = False
    states: StateTable = dataclasses.field(default_factory=StateTable)


class DropInCompression:
    """Horovod's compression interface around a :class:`~hvdsketch.compress.Compressor`."""

    def __init__(self, compressor: "Compressor | str") -> None:
        self.compressor = one_message(compressor)
        #: The inferred step and the tensors' states of every call this object takes.
        self.session = Session()
        self._sent = 0  # payload bytes counted in Python
        self._dense = 0  # their dense equivalent
        self._warned = False

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        """The payload Horovod averages in place of ``tensor``, and the context :meth:`decompress`
        takes: ``(tensor, None)`` for an integer or empty tensor, passed through."""
        ops = backend(tensor)
        shape = ops.shape(tensor)
        if is_passthrough(tensor):
            return tensor, None
        session = self.session
        traced = ops.is_symbolic(tensor)
        if session.decompressed:  # a new step, or a new trace, which is no step
            session.step, session.decompressed = session.step + (not traced), False
            session.of_shape.clear()
        k = session.of_shape.get(shape, 0)
        session.of_shape[shape] = k + 1
        given, carried = tensor, CARRIED_AS.get(ops.dtype_name(tensor))
        if carried:
            tensor = ops.cast(tensor, carried)
        name = f"shape{shape}#{k}"
        ctx = TensorContext(name, shape, 0 if traced else session.step)
        flight = Flight(self.compressor_for(tensor), tensor, ctx, states=session.states)
        (message,) = flight.messages
        payload = message.tensor
        dtype = ops.dtype_name(payload)
        if dtype in _TAGGED:
            payload = ops.concat([ops.flatten(payload), ops.constant(_tags(shape, str(self.compressor)), dtype, tensor)])
        self._count(ops.nbytes(payload), ops.nbytes(given))
        return payload, (flight, ctx, ops.shape(message.tensor), dtype, given)

    def compressor_for(self, tensor: Any) -> Compressor:
        """The compressor that exchanges ``tensor`` (here: the one this compression was made with)."""
        return self.compressor

    def decompress(self, tensor: Any, state: Any) -> Any:
        """The averaged gradient, once the tags agreed (else an error on every rank); one not finite is handed back
        as it is, its state left as before (eager)."""
        self.session.decompressed = True  # passed through (or Horovod's sparse allreduce) too
        if state is None:
            return tensor
        flight, ctx, message_shape, dtype, given = state
        ops = backend(tensor)
        narrow = dtype if dtype in NARROW else None
        name = f"of shape {ctx.shape}"
        disagree = (f"hvdsketch: ranks disagree on a gradient's shape or compression spec "
                    f"(this rank: shape {ctx.shape}, {self.compressor})")
        agreed = None
        if dtype in _TAGGED:
            want = _tags(ctx.shape, str(self.compressor))
            body, tags = ops.split(tensor, [ops.shape(tensor)[0] - len(want), len(want)])
            want = ops.constant(want, dtype, tensor)
            agreed = ops.reduce_min(ops.cast(abs(tags - want) <= _TAG_RTOL * abs(want), "int64")) > 0
            tensor = ops.reshape(body, message_shape)
        finite, traced = True, ops.is_symbolic(tensor)
        if traced:  # inside tf.function: an assertion that runs with the step
            if agreed is not None:
                ops.check_true(agreed, disagree)
        else:
            flags = [ops.all_finite_flag(tensor)] + ([agreed] if agreed is not None else [])
            if not ops.all_true(flags):
                if agreed is not None and not ops.all_true(flags[1:]):
                    raise ValueError(disagree)
                finite = False
        undo = Undo()
        with undoable(undo):
            if not flight.advance([tensor]):
                raise RuntimeError(f"hvdsketch: {self.compressor.name} asked for a second round in the drop-in path")
        if traced:  # each run of the graph puts the held record back where the average is not finite
            undo.revert_unless(ops.all_finite_flag(tensor))
        elif not finite:
            flight.rewind()
            undo.revert()
            self._warn_once(name, ops.all_true([ops.all_finite_flag(given)]), narrow)
        carried = ops.dtype_name(given) in CARRIED_AS
        return ops.cast(flight.result, ops.dtype_name(given)) if carried else flight.result

    def _warn_once(self, name: str, finite_here: bool, narrow: str | None) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"{nonfinite_message(name, 'this rank', finite_here, narrow, str(self.compressor))}; "
                          f"handed back as it is, as Horovod does, for a loss scaler to skip the step, the "
                          f"compression's state kept as it was before it (warned once)", NonfiniteStep, stacklevel=3)

    def _count(self, sent: int, dense: int) -> None:
        self._sent += sent
        self._dense += dense

    def counts(self) -> tuple[int, int]:
        """Payload bytes sent and their dense equivalent since construction."""
        return self._sent, self._dense

    def report(self) -> dict[str, float]:
        """Bytes sent and their dense equivalent since construction, and their ratio."""
        sent, dense = self.counts()
        return {"compression": str(self.compressor), "bytes_sent": sent, "bytes_dense": dense,
                "ratio": dense / sent if sent else float("nan")}

    def __repr__(self) -> str:
        return f"DropInCompression({str(self.compressor)!r})"


class PresetCompression(DropInCompression):
    """A drop-in compression a ``Compression`` namespace made; called with options it gives the
    namespace's compression with those options changed (``Compression.sketch(error=0.5)``)."""

    #: The namespace that made it.
    namespace: type["CompressionNamespace"]

    def __call__(self, **options: Any) -> "PresetCompression":
        current = {f.name: getattr(self.compressor, f.name) for f in dataclasses.fields(self.compressor)  # type: ignore[arg-type]
                   if f.init}
        return self.namespace.with_options(self.compressor.name, **{**current, **options})


class _Preset:
    """A compressor's name as an attribute of a ``Compression`` namespace (``Compression.fp16``): reading it
    gives :meth:`CompressionNamespace.with_options`'s compression, or raises its ``ValueError``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type["CompressionNamespace"]) -> "PresetCompression":
        return owner.with_options(self.name)


class CompressionNamespace:
    """Horovod's ``Compression`` namespace with every hvdsketch compressor by name.

    ``Compression.none``, ``Compression.fp16``, ``Compression.sketch`` and every other drop-in compressor,
    called with options for other settings (``Compression.sketch(error=0.5, rows=3)``), or by flag with
    :meth:`from_spec`, each in its one-message form (:meth:`~hvdsketch.compress.Compressor.one_message`).
    The others (``Compression.topk``, ...) raise a ``ValueError`` naming :attr:`own`. A compression's inferred
    steps, tensor states and byte counts are its own (:attr:`one_per_flag`).
    """

    #: The drop-in compression class of the framework.
    drop_in: type[PresetCompression] = PresetCompression
    #: What runs the compressors Horovod's ``compression=`` cannot, for the error message.
    own: str = "hvdsketch's DistributedOptimizer / DistributedGradientTape"
    #: Whether a flag gives one object at every use (``Compression.fp16 is Compression.fp16``), or each use a new one.
    one_per_flag: bool = False
    _made: dict[tuple[type, str], PresetCompression] = {}  # (namespace, flag) -> its one compression

    @classmethod
    def from_spec(cls, flag: "str | Compressor") -> PresetCompression:
        """The drop-in compression of ``flag``, e.g. ``"sketch:error=0.5"``: a new one, or where :attr:`one_per_flag`,
        the namespace's one of that flag. Raises :class:`~hvdsketch.spec.SpecError` or ``ValueError`` for a flag
        that is not valid or that Horovod's ``compression=`` cannot carry, naming :attr:`own`."""
        compressor = one_message(flag, cls.own)
        key = (cls, str(compressor))
        if cls.one_per_flag and key in cls._made:
            return cls._made[key]
        made = cls.drop_in(compressor)
        made.namespace = cls
        if cls.one_per_flag:
            cls._made[key] = made
        return made

    @classmethod
    def with_options(cls, name: str, **options: Any) -> PresetCompression:
        """Compressor ``name``'s drop-in compression with ``options`` (validated), as :meth:`from_spec` gives it."""
        return cls.from_spec(create(name, **options))


for _name in REGISTRY:
    setattr(CompressionNamespace, _name, _Preset(_name))
