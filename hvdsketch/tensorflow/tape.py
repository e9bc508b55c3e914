"""``hvdsketch.tensorflow.DistributedGradientTape``: Horovod's tape, its arguments and their meaning,
with any hvdsketch compressor.

``gradient()`` computes the local gradients, then reduces them through hvdsketch's exchange
(:mod:`hvdsketch.tensorflow.gradients`: how it overlaps backward inside ``tf.function``, and what runs in Python
ops). ``tf.IndexedSlices`` gradients stay sparse with the sketch. Per-tensor policies (:mod:`hvdsketch.policy`)
work eagerly and inside ``tf.function``, where decisions are fixed at tracing (from eager stand-ins of the
gradients, unless earlier eager steps decided). The tape is made anew every step; the tapes of one setup
(compression, memory, op, ...) share one exchange, so its state lasts.
"""
from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from hvdsketch.compress import Compressor
from hvdsketch.exchange.session import Policy, unwrapped
from hvdsketch.tensorflow.arguments import adasum_refusal, groups_of, reduction_of
from hvdsketch.tensorflow.gradients import GradientExchange, gradient_exchange


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape: tf.GradientTape, exchange: GradientExchange, groups: Any, scale_local_gradients: bool,
                 persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._exchange = exchange
        self._session = exchange.session
        self._groups = groups
        self.scale_local_gradients = scale_local_gradients
        self._local_sources: set[Any] = set()

    def register_local_source(self, source: tf.Variable) -> None:
        """As in Horovod: ``source``'s gradient is not reduced, only divided by the process set's size
        when ``scale_local_gradients``."""
        self._local_sources.add(source.ref())

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None, use_generic_names: bool = False, **kwargs):
        grads = super(self.__class__, self).gradient(target, sources, output_gradients, **kwargs)
        flat = self._exchange(tf.nest.flatten(grads), tf.nest.flatten(sources), self._groups, self._local_sources,
                              self.scale_local_gradients, generic_names=use_generic_names)
        return tf.nest.pack_sequence_as(grads, flat)

    def report(self) -> dict[str, Any]:
        """Bytes sent against a dense allreduce and the policy's choices, over every tape of this setup."""
        return self._exchange.report()

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """As in Horovod: ``([(local source, gradient)], [(reduced source, gradient)])``."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        pairs = list(zip(sources, grads))
        return ([(s, g) for s, g in pairs if s.ref() in self._local_sources],
                [(s, g) for s, g in pairs if s.ref() not in self._local_sources])


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression: "str | Compressor | Policy | Mapping | list | None" = None,
                            sparse_as_dense: bool = False, op: Any = None, gradient_predivide_factor: float = 1.0,
                            num_groups: int = 0, groups: Any = None, process_set: Any = None,
                            scale_local_gradients: bool = True, memory: Any = None,
                            error_if_nonfinite: bool = False) -> tf.GradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` returns gradients reduced across Horovod ranks.

    Horovod 0.28.1's arguments, in its order, with its meaning:

    Args:
        gradtape: the ``tf.GradientTape`` that recorded the loss.
        device_dense / device_sparse: the device of the exchange of dense / ``tf.IndexedSlices``
            gradients (default: where TensorFlow places it).
        compression: a flag such as ``"sketch:error=0.5"`` or ``"auto"``, per-tensor rules, a
            compressor, a :class:`hvdsketch.policy.Policy`, a drop-in compression or Horovod's
            ``Compression.none`` / ``.fp16``; falls back to ``HVDSKETCH_COMPRESSION``, then ``"none"``.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before compressing; they come back dense.
        op: ``hvd.Average`` (default) or ``hvd.Sum``; ``hvd.Adasum`` only with ``compression="none"`` and no
            memory (Horovod's own Adasum tape).
        gradient_predivide_factor: with ``op=Average``, gradients are scaled by ``1 / factor`` before
            the sum and ``factor / size`` after it.
        num_groups / groups: Horovod's explicit groups (a number of groups, or lists of variables, the rest
            each a group of one): inside ``tf.function`` a group's exchanges start once all its gradients exist.
        process_set: the Horovod process set to reduce over (default: every rank); on ranks
            outside it the gradients stay local, as in Horovod.
        scale_local_gradients: divide the gradients of sources registered with
            ``register_local_source`` by the process set's size.
        memory: error feedback: a ``--memory`` flag (``"fp32"``) or a :class:`hvdsketch.memory.Memory`;
            ``None`` for none.
        error_if_nonfinite: ``False`` (the default): a NaN or Inf average is handed back, as Horovod's is, for
            a loss scaler to skip the step, hvdsketch's state kept as before it; ``True``: raise on every rank
            (``FloatingPointError`` eagerly, a failed assertion inside ``tf.function``).

    Returns:
        An instance of ``gradtape``'s own class over the same recording, whose ``gradient()`` returns the
        reduced gradients, with Horovod's ``register_local_source`` and ``get_local_and_global_gradients``
        and ``report()``; with ``op=hvd.Adasum``, Horovod's own tape.

    Raises:
        ValueError: a flag or option that is not valid, or an ``op`` the compression cannot
            combine (Adasum).
        TypeError: ``gradtape`` is one that Horovod's or hvdsketch's ``DistributedGradientTape`` already wrapped.

    Example::

        @tf.function
        def training_step(images, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            tape = hvdsketch.tensorflow.DistributedGradientTape(tape, compression="sketch:error=0.5")
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
    """
    if callable(getattr(gradtape, "register_local_source", None)):
        whose = "hvdsketch.tensorflow" if hasattr(gradtape, "_exchange") else "hvd"
        raise TypeError(f"hvdsketch: DistributedGradientTape got a tape that {whose}.DistributedGradientTape already "
                        f"wrapped (it has register_local_source()), whose gradients would be reduced twice; wrap the "
                        f"tf.GradientTape once, with hvdsketch.tensorflow.DistributedGradientTape alone (it takes "
                        f"Horovod's arguments): with tf.GradientTape() as tape: ...; then "
                        f"tape = hvdsketch.tensorflow.DistributedGradientTape(tape, compression=...)")
    import horovod.tensorflow as hvd

    reduction = reduction_of(hvd, op, gradient_predivide_factor)
    groups = groups_of(num_groups, groups)
    compression = unwrapped(compression)
    if reduction == "adasum":
        refusal = adasum_refusal(compression, memory)
        if refusal:
            raise ValueError(refusal)
        return hvd.DistributedGradientTape(gradtape, device_dense, device_sparse, hvd.Compression.none,
                                           sparse_as_dense, hvd.Adasum, gradient_predivide_factor, 0, groups,
                                           hvd.global_process_set if process_set is None else process_set,
                                           scale_local_gradients)
    exchange = gradient_exchange(hvd, compression, memory, reduction, sparse_as_dense, gradient_predivide_factor,
                                 process_set, device_dense, device_sparse, error_if_nonfinite)
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_DistributedGradientTape.__dict__))
    return cls(gradtape._tape, exchange, groups, scale_local_gradients, gradtape._persistent,
               gradtape._watch_accessed_variables)
