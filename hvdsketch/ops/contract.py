"""What every array back-end provides: :class:`Ops`, the functions algorithms may call.

``hvdsketch.ops.numpy``, ``.torch`` and ``.tensorflow`` implement this protocol (a unit test checks their
functions and signatures). Its rules:

* **Every creating function takes the tensor it is like** (``like``, or the index / value tensor it works on)
  and makes its result on that tensor's device.
* **Host syncs are named**: a function that reads a device value on the host, or whose output size depends
  on the values, says "host sync" in its docstring.
* **Results of the gradient's size may go into** ``out``, memory made once (PyTorch and numpy; TensorFlow's
  tensors are immutable, so there ``out`` is always ``None``).
"""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol, Sequence

import numpy as np

Tensor = Any


class Ops(Protocol):
    """The functions of one array back-end (a module), as algorithms see them."""

    #: The framework: ``"numpy"``, ``"torch"`` or ``"tensorflow"``.
    name: str
    #: Whether its tensors can be written into (``out=``, :meth:`into`): numpy and PyTorch.
    writable: bool

    # -- what a tensor is ----------------------------------------------------------------------

    def dtype_name(self, x: Tensor) -> str:
        """``x``'s dtype by its numpy name (``"float32"``, ``"bfloat16"``, ``"int64"``)."""

    def is_floating(self, x: Tensor) -> bool:
        """Whether ``x`` holds floating-point numbers."""

    def shape(self, x: Tensor) -> tuple[int, ...]:
        """``x``'s static shape (TensorFlow: a clear error when it is not fully known)."""

    def nbytes(self, x: Tensor) -> int | None:
        """Bytes of ``x`` (TensorFlow inside ``tf.function``: ``None`` when known only at run time)."""

    def device_name(self, x: Tensor) -> str:
        """Where ``x`` lives: ``"cpu"`` for host memory, else e.g. ``"cuda:0"``."""

    def is_symbolic(self, x: Tensor) -> bool:
        """True while a graph is being traced (``tf.function``): values do not exist yet."""

    # -- state a traced graph keeps between its runs --------------------------------------------

    def outside_trace(self) -> ContextManager:
        """A context that makes tensors eagerly even while a graph is traced; a no-op where nothing is."""

    def hold(self, x: Tensor) -> Tensor:
        """Memory holding ``x`` that a traced graph reads and :meth:`assign` writes (TensorFlow: a ``tf.Variable``)."""

    def is_held(self, x: Tensor) -> bool:
        """Whether ``x`` was made by :meth:`hold`."""

    def assign(self, held: Tensor, x: Tensor) -> None:
        """Write ``x`` (of ``held``'s shape and dtype) into ``held``: in a traced graph, at each run."""

    def held_value(self, held: Tensor) -> Tensor:
        """What ``held`` holds now, unaffected by later calls of :meth:`assign`."""

    def unless(self, flag: Tensor, action: Callable[[], None]) -> None:
        """Run ``action`` where the 0-d truth ``flag`` is false: eagerly at once (host sync), traced as a branch."""

    # -- creating tensors (each on ``like``'s device) -------------------------------------------

    def zeros(self, n: int | Sequence[int], dtype: str, like: Tensor) -> Tensor:
        """Zeros of shape ``n`` and ``dtype`` on ``like``'s device."""

    def arange(self, n: int, like: Tensor) -> Tensor:
        """``0, 1, ..., n - 1`` as int64 on ``like``'s device."""

    def constant(self, values: Sequence[float], dtype: str, like: Tensor) -> Tensor:
        """The host numbers ``values`` as a 1-D ``dtype`` tensor on ``like``'s device (not waiting for queued work)."""

    def host_constant(self, values: Sequence[float], dtype: str) -> Tensor:
        """The numbers ``values`` as a 1-D ``dtype`` tensor in host memory (control values, never gradient data)."""

    def uniform(self, shape: int | Sequence[int], seed: int, like: Tensor) -> Tensor:
        """Uniform numbers in ``[0, 1)`` of ``like``'s floating dtype and device, a pure function of ``seed``
        within a back-end and device type."""

    def from_numpy(self, a: np.ndarray, like: Tensor) -> Tensor:
        """The numpy array ``a`` as a tensor of ``like``'s back-end on ``like``'s device (a copy)."""

    def adopt(self, a: np.ndarray, like: Tensor) -> Tensor:
        """The numpy array ``a`` as a tensor like ``like``, sharing ``a``'s memory on the host, else copied."""

    def indicator(self, n: int, idx: Tensor, dtype: str) -> Tensor:
        """A length-``n`` vector of ``dtype``, 1 at ``idx`` and 0 elsewhere, on ``idx``'s device."""

    def scatter(self, n: int, idx: Tensor, values: Tensor, out: Tensor | None = None, clear: bool = True) -> Tensor:
        """A length-``n`` vector, ``values`` at the distinct ``idx`` and 0 elsewhere (into ``out`` when given;
        ``clear=False``: ``out`` is 0 outside ``idx`` already)."""

    def scatter_add(self, n: int, idx: Tensor, values: Tensor, out: Tensor | None = None) -> Tensor:
        """A length-``n`` vector, at each index the sum of the ``values`` given for it (into ``out`` when given)."""

    def axpy(self, a: float, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
        """``a * x + y`` in one pass (into ``out`` when given, which may be ``x``)."""

    def zero_at(self, x: Tensor, idx: Tensor, out: Tensor | None = None) -> Tensor:
        """``x`` with the flat positions ``idx`` set to 0 (into ``out`` when given, which may be ``x``)."""

    def same_memory(self, a: Tensor, b: Tensor) -> bool:
        """Whether ``a`` and ``b`` start at the same element of one memory, in one dtype (TensorFlow: never)."""

    def into(self, out: Tensor, x: Tensor) -> Tensor:
        """``x`` (of ``out``'s size, any dtype) written into ``out`` in its shape and dtype, and ``out`` returned;
        no copy when ``x`` is ``out``'s memory already (TensorFlow: raises)."""

    def add_rows(self, x: Tensor, indices: Tensor, rows: Tensor) -> Tensor:
        """``x`` with ``rows[k]`` added to its row ``indices[k]`` (repeats add up), as a new tensor."""

    # -- moving tensors ---------------------------------------------------------------------------

    def to_numpy(self, x: Tensor) -> np.ndarray:
        """``x`` as a numpy array in host memory (host sync)."""

    def to_host(self, x: Tensor) -> Tensor:
        """A copy of ``x`` in host memory, complete on return (host sync)."""

    def to_device(self, x: Tensor, like: Tensor) -> Tensor:
        """``x`` (host) on ``like``'s device (a host sync on CUDA)."""

    def synchronize(self, x: Tensor) -> None:
        """Block until ``x`` and the device work queued before it are done (host sync)."""

    # -- shaping and element-wise ---------------------------------------------------------------

    def cast(self, x: Tensor, dtype: str) -> Tensor:
        """``x`` converted to ``dtype``."""

    def reshape(self, x: Tensor, new_shape: Sequence[int]) -> Tensor:
        """``x`` with ``new_shape`` (one entry may be -1)."""

    def flatten(self, x: Tensor) -> Tensor:
        """``x`` as a vector."""

    def concat(self, xs: Sequence[Tensor]) -> Tensor:
        """The vectors ``xs`` one after another."""

    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
        """The vector ``x`` cut into consecutive pieces of ``sizes``."""

    def stack(self, xs: Sequence[Tensor]) -> Tensor:
        """``xs`` of one shape stacked along a new first dimension."""

    def pad(self, x: Tensor, n: int) -> Tensor:
        """The vector ``x`` followed by ``n`` zeros (``x`` itself, not a copy, when ``n`` is 0)."""

    def outer_add(self, a: Tensor, b: Tensor) -> Tensor:
        """Flattened ``a[:, None] + b[None, :]``."""

    def transpose(self, x2d: Tensor) -> Tensor:
        """The transpose of a matrix."""

    def matmul(self, a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
        """The matrix product ``a b`` (written into ``out``, of its shape and dtype, when given)."""

    def sub_matmul(self, c: Tensor, a: Tensor, b: Tensor) -> Tensor:
        """``c - a b``, a new matrix, in one pass over ``c`` where the back-end has one."""

    def sign(self, x: Tensor) -> Tensor:
        """-1, 0 or 1 by the sign of each element."""

    def floor(self, x: Tensor) -> Tensor:
        """Each element rounded down."""

    def log2(self, x: Tensor) -> Tensor:
        """The base-2 logarithm of each element (``-inf`` at 0)."""

    def clip(self, x: Tensor, low: float | None = None, high: float | None = None) -> Tensor:
        """``x`` limited to ``[low, high]`` element-wise (``None``: unbounded on that side)."""

    def where(self, condition: Tensor, x: Tensor | float, y: Tensor | float) -> Tensor:
        """``x`` where ``condition`` holds, else ``y`` (broadcast; at least one of them a tensor)."""

    def gather(self, x: Tensor, idx: Tensor) -> Tensor:
        """The entries of ``x`` at the int64 indices ``idx``."""

    # -- reductions -----------------------------------------------------------------------------

    def reduce_sum(self, x: Tensor, axis: int | None = None) -> Tensor:
        """The sum of ``x`` (along ``axis``)."""

    def reduce_max(self, x: Tensor, axis: int | None = None) -> Tensor:
        """The maximum of ``x`` (along ``axis``)."""

    def reduce_min(self, x: Tensor, axis: int | None = None) -> Tensor:
        """The minimum of ``x`` (along ``axis``)."""

    def bucket_norms(self, x: Tensor, size: int, order: float) -> Tensor:
        """The ``order``-norm (1, 2 or ``inf``) of each run of ``size`` entries of the vector ``x``; NaN propagates."""

    def sqnorm(self, x: Tensor) -> Tensor:
        """``sum x^2``, accumulated in float64, as a 0-d float64 tensor on ``x``'s device."""

    def sort0(self, x: Tensor) -> Tensor:
        """``x`` sorted along its first dimension."""

    def cumsum(self, x: Tensor) -> Tensor:
        """Running sums of the vector ``x`` in its dtype: ``out[k] = x[0] + ... + x[k]``."""

    def bitwise_or_rows(self, x2d: Tensor) -> Tensor:
        """The bitwise OR of the rows of an integer matrix."""

    def orthonormalize(self, x2d: Tensor) -> Tensor:
        """Orthonormal columns spanning those of the ``n x r`` matrix ``x2d`` (``n >= r``): its reduced QR's Q."""

    # -- stochastic rounding ----------------------------------------------------------------

    def stochastic_round(self, x: Tensor, scales: Tensor, size: int, limit: int, seed: int, dtype: str) -> Tensor:
        """``floor(y_i + u_i)`` of ``y_i = x_i * scales[i // size]``, ``u_i`` uniform in ``[0, 1)`` (so
        ``E[result_i] = y_i``), clipped to ``[-limit, limit]``, as the integer ``dtype``. The draws, of at least
        16 random bits each, are a pure function of ``seed`` within a back-end and device type."""

    def scaled_sum(self, codes: Tensor, scales: Tensor, size: int, out: Tensor | None = None) -> Tensor:
        """``sum_r codes[r, i] * scales[r, i // size]`` (one row per rank), in ``scales``' dtype (into ``out``)."""

    def sign_sum(self, bits: Tensor, scales: Tensor, n: int, out: Tensor | None = None) -> Tensor:
        """``sum_r scales[r] * (2 b_ri - 1)`` over the first ``n`` bits of each row of the packed uint8 ``bits``
        (one row per rank, :meth:`pack_bits`' order), in ``scales``' dtype (into ``out`` when given)."""

    # -- selecting (output sizes marked "host sync" depend on the values) -----------------------

    def topk_abs(self, x: Tensor, k: int) -> Tensor:
        """int64 indices of the ``k`` entries of the vector ``x`` largest in magnitude (ties: any; NaN largest)."""

    def select_abs_at_least(self, x: Tensor, threshold: Tensor, limit: int) -> Tensor:
        """int64 indices of the entries of the vector ``x`` with ``|x| >= threshold``, at most the ``limit``
        largest in magnitude; NaN qualifies and ranks largest (host sync: the count)."""

    def nonzero_rows(self, x2d: Tensor) -> Tensor:
        """int64 indices of the rows of ``x2d`` with a bit set, NaN and -0.0 included (host sync: the count)."""

    def positive(self, x: Tensor) -> Tensor:
        """int64 indices where the vector ``x`` is > 0 (host sync: the count)."""

    def where_less(self, x: Tensor, bound: int) -> Tensor:
        """The entries of the int64 vector ``x`` below ``bound`` (host sync: the count)."""

    def coalesce_rows(self, indices: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Distinct row indices (int64, sorted) and the sum of the rows given for each (host sync: the count)."""

    # -- bits -----------------------------------------------------------------------------------

    def pack_bits(self, mask: Tensor) -> Tensor:
        """The vector ``mask`` as uint8, 8 truths a byte, highest bit first, the last byte zero-padded."""

    def sign_bits(self, x: Tensor) -> Tensor:
        """:meth:`pack_bits` of ``x >= 0`` for the vector ``x`` (NaN: 0)."""

    def unpack_bits(self, bits: Tensor) -> Tensor:
        """Every bit of the uint8 vector ``bits`` as a uint8 0 or 1, highest bit first."""

    # -- checks (raise the same error on every rank, given the same reduced values) -------------

    def all_finite_flag(self, x: Tensor) -> Tensor:
        """A 0-d truth on ``x``'s device: every element of ``x`` is finite (no host sync)."""

    def all_true(self, flags: Sequence[Tensor]) -> bool:
        """Whether every 0-d truth in ``flags`` holds: one host sync for all of them."""

    def check_true(self, flag: Tensor, message: str) -> None:
        """Raise ``ValueError(message)`` unless ``flag`` holds (host sync; in ``tf.function`` an assertion)."""

    def check_finite(self, x: Tensor, message: str) -> Tensor:
        """``x``, after raising ``FloatingPointError(message)`` if it holds NaN or Inf (host sync; TensorFlow:
        an assertion raising ``InvalidArgumentError``)."""

    def call_if(self, flag: Tensor | bool, fn: Callable[..., None], values: Sequence[Tensor | int]) -> None:
        """Call ``fn`` with ``values`` as numpy when the truth ``flag`` holds (host sync; in ``tf.function`` a
        conditional op that runs with the step)."""
