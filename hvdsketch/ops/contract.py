"""What every array back-end provides: :class:`Ops`, the functions algorithms may call.

``hvdsketch.ops.numpy``, ``.torch`` and ``.tensorflow`` are modules that
implement this protocol (a unit test checks that each defines exactly these
functions with these signatures). Two rules make the algorithms written against
it run on an accelerator as they run on the host:

* **Every creating function takes the tensor it is like** (``like``, or the
  index / value tensor it works on): what it makes lives on that tensor's
  device, so nothing on the gradient path is made in host memory and copied.
* **Host syncs are named.** A function that reads a device value on the host,
  or whose output size depends on the values (so the host must wait to learn
  it), says so in its docstring ("host sync"); the rest only queue device work.

A third keeps the gradient path from allocating a dense result every step
(on the host, fresh memory costs more than the copy it holds): the functions
that make a tensor of the gradient's size take ``out``, memory of that size
made once (the gradient's own), and write into it. PyTorch and numpy do;
TensorFlow's tensors are immutable, so there ``out`` is always ``None``.
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
        """A context in which tensors are made eagerly even while a graph is being traced (for the
        first value of :meth:`hold`); no-op where nothing is traced."""

    def hold(self, x: Tensor) -> Tensor:
        """Memory holding the eager ``x`` that a traced graph reads and :meth:`assign` writes at each
        of its runs (TensorFlow: a ``tf.Variable``); ``x`` itself where nothing is traced."""

    def is_held(self, x: Tensor) -> bool:
        """Whether ``x`` was made by :meth:`hold`."""

    def assign(self, held: Tensor, x: Tensor) -> None:
        """Write ``x`` (of ``held``'s shape and dtype) into ``held``: in a traced graph, at each run."""

    def held_value(self, held: Tensor) -> Tensor:
        """What ``held`` holds now, left as it is by later :meth:`assign`\ s (in a traced graph, a
        read that runs before them)."""

    def unless(self, flag: Tensor, action: Callable[[], None]) -> None:
        """Run ``action`` (writes of held memory) where the 0-d truth ``flag`` is false: eagerly at
        once (a host sync), in a traced graph as a branch that runs with the step."""

    # -- creating tensors (each on ``like``'s device) -------------------------------------------

    def zeros(self, n: int | Sequence[int], dtype: str, like: Tensor) -> Tensor:
        """Zeros of shape ``n`` and ``dtype`` on ``like``'s device."""

    def arange(self, n: int, like: Tensor) -> Tensor:
        """``0, 1, ..., n - 1`` as int64 on ``like``'s device."""

    def constant(self, values: Sequence[float], dtype: str, like: Tensor) -> Tensor:
        """The host numbers ``values`` as a 1-D tensor of ``dtype`` on ``like``'s device (copied
        without waiting for the device's queued work)."""

    def host_constant(self, values: Sequence[float], dtype: str) -> Tensor:
        """The numbers ``values`` as a 1-D tensor of ``dtype`` in host memory: control values that
        ride beside the gradients (the step tag), never gradient data; reading them waits for no device."""

    def uniform(self, shape: int | Sequence[int], seed: int, like: Tensor) -> Tensor:
        """Uniform numbers in ``[0, 1)`` of ``like``'s floating dtype on its device, a pure
        function of ``seed`` within a back-end and device type."""

    def from_numpy(self, a: np.ndarray, like: Tensor) -> Tensor:
        """The numpy array ``a`` as a tensor of ``like``'s back-end on ``like``'s device (restoring
        checkpoints; not for the per-step path)."""

    def adopt(self, a: np.ndarray, like: Tensor) -> Tensor:
        """The numpy array ``a`` as a tensor like ``like``: sharing ``a``'s memory where ``like`` is in
        host memory (the caller hands ``a`` over: no copy), copied to ``like``'s device otherwise (the
        MPI layer's results)."""

    def indicator(self, n: int, idx: Tensor, dtype: str) -> Tensor:
        """A length-``n`` vector of ``dtype``, 1 at ``idx`` and 0 elsewhere, on ``idx``'s device."""

    def scatter(self, n: int, idx: Tensor, values: Tensor, out: Tensor | None = None, clear: bool = True) -> Tensor:
        """A length-``n`` vector, ``values`` at ``idx`` (distinct) and 0 elsewhere, on ``values``' device
        (written into the length-``n`` vector ``out`` when given, and that returned; ``clear=False``:
        ``out`` holds 0 outside ``idx`` already, and only ``idx`` is written)."""

    def scatter_add(self, n: int, idx: Tensor, values: Tensor, out: Tensor | None = None) -> Tensor:
        """A length-``n`` vector holding at each index the sum of the ``values`` given for it
        (written into the length-``n`` vector ``out`` when given, and that returned)."""

    def axpy(self, a: float, x: Tensor, y: Tensor, out: Tensor | None = None) -> Tensor:
        """``a * x + y`` in one pass (written into ``out``, of their shape, when given, which may be
        ``x`` itself, and that returned)."""

    def zero_at(self, x: Tensor, idx: Tensor, out: Tensor | None = None) -> Tensor:
        """``x`` with the entries at the flat positions ``idx`` set to 0 (written into ``out`` when
        given, which may be ``x`` itself, and that returned)."""

    def same_memory(self, a: Tensor, b: Tensor) -> bool:
        """Whether ``a`` and ``b`` start at the same element of one memory, in one dtype (TensorFlow:
        never, its tensors are not written into)."""

    def into(self, out: Tensor, x: Tensor) -> Tensor:
        """``x`` (of ``out``'s number of elements, any dtype) written into ``out`` as ``out``'s shape
        and dtype, one read and one write; ``out`` returned, and nothing copied when ``x`` is
        ``out``'s memory already (TensorFlow: raises, nothing is written into there)."""

    def add_rows(self, x: Tensor, indices: Tensor, rows: Tensor) -> Tensor:
        """``x`` with ``rows[k]`` added to its row ``indices[k]`` (repeats add up), as a new tensor."""

    # -- moving tensors ---------------------------------------------------------------------------

    def to_numpy(self, x: Tensor) -> np.ndarray:
        """``x`` as a numpy array in host memory (host sync)."""

    def to_host(self, x: Tensor) -> Tensor:
        """A copy of ``x`` in host memory, complete on return (host sync)."""

    def to_device(self, x: Tensor, like: Tensor) -> Tensor:
        """``x`` (host) on ``like``'s device (from pageable host memory: a host sync on CUDA)."""

    def synchronize(self, x: Tensor) -> None:
        """Block until ``x`` and the device work queued before it are done (for timing; host sync)."""

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
        """The ``order``-norm (1, 2 or ``inf``) of each run of ``size`` consecutive entries of the vector
        ``x`` (the last run may be shorter), as a vector of ``x``'s dtype; NaN propagates."""

    def sqnorm(self, x: Tensor) -> Tensor:
        """``sum x^2``, accumulated in float64, as a 0-d float64 tensor on ``x``'s device."""

    def sort0(self, x: Tensor) -> Tensor:
        """``x`` sorted along its first dimension."""

    def cumsum(self, x: Tensor) -> Tensor:
        """Running sums of the vector ``x`` in its dtype: ``out[k] = x[0] + ... + x[k]``."""

    def bitwise_or_rows(self, x2d: Tensor) -> Tensor:
        """The bitwise OR of the rows of an integer matrix."""

    def orthonormalize(self, x2d: Tensor) -> Tensor:
        """Orthonormal columns spanning those of the ``n x r`` matrix ``x2d`` (``n >= r``): the Q of
        its reduced QR decomposition (Householder, so rank-deficient inputs still give orthonormal Q)."""

    # -- stochastic rounding ----------------------------------------------------------------

    def stochastic_round(self, x: Tensor, scales: Tensor, size: int, limit: int, seed: int, dtype: str) -> Tensor:
        """Each ``y_i = x_i * scales[i // size]`` of the vector ``x`` rounded to an integer, up with the
        probability of its fraction and down otherwise (``floor(y_i + u_i)``, ``u_i`` uniform in
        ``[0, 1)``, so ``E[result_i] = y_i``), clipped to ``[-limit, limit]``, as the integer ``dtype``.
        The draws are a pure function of ``seed`` within a back-end and device type, with at least 16
        random bits each (a bias of at most ``2^-17``, no more than float32's own rounding of ``y``
        near 127)."""

    def scaled_sum(self, codes: Tensor, scales: Tensor, size: int, out: Tensor | None = None) -> Tensor:
        """``sum_r codes[r, i] * scales[r, i // size]`` for the integer matrix ``codes`` (one row per
        rank) and the float matrix ``scales``: a vector of ``codes``' row length and ``scales``' dtype
        (written into ``out``, of that length and dtype, when given)."""

    def sign_sum(self, bits: Tensor, scales: Tensor, n: int, out: Tensor | None = None) -> Tensor:
        """``sum_r scales[r] * (2 b_ri - 1)`` over the first ``n`` bits ``b_r`` of each row of the packed
        uint8 matrix ``bits`` (one row per rank, :meth:`pack_bits`' order) and the vector ``scales``: a
        vector of length ``n`` and ``scales``' dtype (written into ``out``, of that length and dtype, when given)."""

    # -- selecting (output sizes marked "host sync" depend on the values) -----------------------

    def topk_abs(self, x: Tensor, k: int) -> Tensor:
        """int64 indices of the ``k`` entries of the vector ``x`` largest in magnitude (ties: any;
        NaN ranks largest); no host sync."""

    def select_abs_at_least(self, x: Tensor, threshold: Tensor, limit: int) -> Tensor:
        """int64 indices of the entries of the vector ``x`` with ``|x| >= threshold``, at most the
        ``limit`` largest in magnitude of them; NaN qualifies and ranks largest (host sync: the count)."""

    def nonzero_rows(self, x2d: Tensor) -> Tensor:
        """int64 indices of the rows of ``x2d`` with a bit set: NaN and -0.0 count as non-zero (a zero
        row sent costs bytes, never exactness), and no back-end compares floats (host sync: the count)."""

    def positive(self, x: Tensor) -> Tensor:
        """int64 indices where the vector ``x`` is > 0 (host sync: the count)."""

    def where_less(self, x: Tensor, bound: int) -> Tensor:
        """The entries of the int64 vector ``x`` below ``bound`` (host sync: the count)."""

    def coalesce_rows(self, indices: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Distinct row indices (int64, sorted) and the sum of the rows given for each (host sync:
        the count)."""

    # -- bits -----------------------------------------------------------------------------------

    def pack_bits(self, mask: Tensor) -> Tensor:
        """The truth values of the vector ``mask`` as uint8, 8 per byte, first in the highest bit,
        the last byte padded with zeros."""

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
        """Raise ``ValueError(message)`` unless ``flag`` holds (host sync; inside ``tf.function``
        an assertion that runs with the step)."""

    def check_finite(self, x: Tensor, message: str) -> Tensor:
        """``x``, after raising ``FloatingPointError(message)`` if it holds NaN or Inf (host sync;
        TensorFlow: an assertion that raises its ``InvalidArgumentError`` with ``message`` when it
        runs, eagerly or with the step inside ``tf.function``)."""

    def call_if(self, flag: Tensor | bool, fn: Callable[..., None], values: Sequence[Tensor | int]) -> None:
        """Call ``fn`` with ``values`` as numpy on the host when the truth ``flag`` holds (a warning
        from reduced values): at once (host sync); inside ``tf.function`` a conditional op that runs
        with the step, its ``flag`` read on the host as an assertion's is, ``values`` copied only when
        it holds."""
