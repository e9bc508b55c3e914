"""``hvdsketch.tensorflow.keras.DistributedOptimizer``: Horovod's tf-keras optimizer with any hvdsketch
compressor, for ``model.fit``.

As ``horovod.tensorflow.keras.DistributedOptimizer`` it returns an optimizer of the wrapped optimizer's own
class (a saved model loads without hvdsketch) whose ``compute_gradients`` reduces the gradients across ranks,
here through hvdsketch's exchange (:mod:`hvdsketch.tensorflow.gradients`), multi-collective compressors
included. Inside ``model.fit``'s ``tf.function``, an exchange whose state a graph cannot hold runs in Python ops
(:meth:`hvdsketch.tensorflow.gradients.GradientExchange.keeps_python_state`).

Checkpoints: ``optimizer.hvdsketch_state`` (:class:`hvdsketch.tensorflow.state.ExchangeState`) is tracked, so
``tf.train.Checkpoint(optimizer=...)`` and ``model.save_weights`` carry every rank's state; under ``model.fit``
give every rank a :class:`GatherStateCallback` ahead of rank 0's ``ModelCheckpoint``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from hvdsketch.exchange.session import unwrapped
from hvdsketch.tensorflow.arguments import groups_of, reduction_of
from hvdsketch.tensorflow.gradients import GradientExchange, gradient_exchange
from hvdsketch.tensorflow.state import ExchangeState

class _Aggregation:
    """Horovod's local gradient aggregation (``backward_passes_per_step``): a counter and one
    accumulator variable per gradient, made at the first step."""

    def __init__(self, passes: int, average: bool, sparse_as_dense: bool) -> None:
        self.passes, self.average, self.sparse_as_dense = passes, average, sparse_as_dense
        self.counter: tf.Variable | None = None
        self.sums: list[tf.Variable] = []

    def add(self, grads: list[Any]) -> list[Any]:
        """Fold this step's gradients in; the sums so far (dense)."""
        grads = [self._dense(g) for g in grads]
        if self.counter is None:
            with tf.init_scope():
                self.counter = tf.Variable(0, trainable=False, name="hvdsketch_aggregation_counter")
                self.sums = [tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False, name="hvdsketch_aggregated")
                             for g in grads]
        for total, g in zip(self.sums, grads):
            total.assign_add(g)
        self.counter.assign_add(1)
        return [total.read_value() for total in self.sums]

    def _dense(self, grad: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            if not self.sparse_as_dense:
                raise ValueError("IndexedSlices are not supported when `backward_passes_per_step` > 1 and "
                                 "`sparse_as_dense` is False.")
            return tf.convert_to_tensor(grad)
        return grad

    def clear(self) -> None:
        self.counter.assign(0)
        for total in self.sums:
            total.assign(tf.zeros_like(total))


@dataclass
class _Setup:
    """What the returned optimizer adds, in one attribute that checkpoints do not track."""

    exchange: GradientExchange
    groups: Any
    scale_local_gradients: bool
    aggregation: _Aggregation | None
    local: set = field(default_factory=set)


class _DistributedOptimizer:
    """The methods the returned optimizer's class adds to the wrapped optimizer's."""

    _hvdsketch: _Setup

    def compute_gradients(self, loss, var_list, tape=None):
        pairs = super(self.__class__, self).compute_gradients(loss, var_list, tape)
        return self._hvdsketch_reduce(pairs)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):  # the legacy optimizers' minimize
        pairs = super(self.__class__, self)._compute_gradients(loss, var_list, grad_loss, tape)
        return self._hvdsketch_reduce(pairs)

    def get_gradients(self, loss, params):
        grads = super(self.__class__, self).get_gradients(loss, params)
        return [g for g, _ in self._hvdsketch_reduce(list(zip(grads, params)))]

    def report(self) -> dict[str, Any]:
        """Bytes sent against a dense allreduce (:meth:`hvdsketch.tensorflow.gradients.GradientExchange.report`)."""
        return self._hvdsketch.exchange.report()

    def register_local_var(self, var: tf.Variable) -> None:
        """As in Horovod: ``var``'s gradient is not reduced, only divided by the process set's size
        when ``scale_local_gradients``."""
        self._hvdsketch.local.add(var.ref())

    @tf.autograph.experimental.do_not_convert
    def _hvdsketch_reduce(self, pairs):
        pairs = list(pairs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._hvdsketch.aggregation is None:
            reduced = self._hvdsketch_exchange(grads, variables)
        else:
            reduced = self._hvdsketch_aggregate(grads, variables)
        return list(zip(reduced, variables))

    def _hvdsketch_exchange(self, grads, variables):
        setup = self._hvdsketch
        return setup.exchange(grads, variables, setup.groups, setup.local, setup.scale_local_gradients)

    def _hvdsketch_aggregate(self, grads, variables):
        aggregation = self._hvdsketch.aggregation
        present = [i for i, g in enumerate(grads) if g is not None]
        sums = aggregation.add([grads[i] for i in present])

        def exchange():
            full = [None] * len(grads)
            for i, total in zip(present, sums):
                full[i] = total
            reduced = self._hvdsketch_exchange(full, variables)
            aggregation.clear()
            return [reduced[i] / aggregation.passes if aggregation.average else reduced[i] for i in present]

        out = tf.cond(tf.equal(aggregation.counter, aggregation.passes), exchange, lambda: sums)
        full = [None] * len(grads)
        for i, g in zip(present, tf.nest.flatten(out)):
            full[i] = g
        return full

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        aggregation = self._hvdsketch.aggregation
        if aggregation is None:
            return super(self.__class__, self).apply_gradients(grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)

        def apply():
            super(self.__class__, self).apply_gradients(pairs, *args, **kwargs)
            return tf.constant(True)

        def skip():  # as Horovod: the steps between exchanges only count
            self.iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(tf.equal(aggregation.counter, 0), apply, skip)


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "", device_sparse: str = "",
                         compression: Any = None, sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: Any = None, backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: Any = None,
                         scale_local_gradients: bool = True, memory: Any = None,
                         error_if_nonfinite: bool = False) -> Any:
    """Wrap a tf-keras optimizer so that the gradients it computes are reduced across Horovod ranks.

    Horovod 0.28.1's arguments, in its order, with its meaning (see
    :func:`hvdsketch.tensorflow.DistributedGradientTape` for those they share), and:

    Args:
        optimizer: a ``tf.keras.optimizers`` optimizer (legacy ones too); a new one of its class
            is made from its config, as Horovod does.
        name: the optimizer's name (default: its own).
        op: ``hvd.Average`` (default) or ``hvd.Sum`` (as Horovod's tf-keras optimizer).
        backward_passes_per_step: steps whose gradients are summed locally before each exchange and
            update; the steps in between only advance ``iterations``.
        average_aggregated_gradients: divide the summed gradients by ``backward_passes_per_step``.
        compression: a flag (``"powersgd:rank=2"``, ``"sketch:density=0.05"``), rules, a compressor,
            a policy, a drop-in compression or Horovod's ``Compression.none`` / ``.fp16``.
        memory: error feedback (``"fp32"``).
        error_if_nonfinite: as the tape's: ``False`` (the default) hands a NaN or Inf average back
            for a loss scaler, hvdsketch's state kept as before the step; ``True`` raises.

    Returns:
        A new optimizer of ``optimizer``'s own class, made from its config (Keras saves it as that
        class), whose gradients are reduced before they are applied, with hvdsketch's ``report()``
        and its state as the trackable ``hvdsketch_state``.

    Raises:
        ValueError: an ``op`` other than ``hvd.Average`` or ``hvd.Sum``, ``backward_passes_per_step``
            below 1, or a flag or option that is not valid.

    Example::

        optimizer = hvdsketch.tensorflow.keras.DistributedOptimizer(
            tf.keras.optimizers.Adam(0.001 * hvd.size()), compression="auto")
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        model.fit(dataset, epochs=5, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
                  verbose=1 if hvd.rank() == 0 else 0)
        print(optimizer.report())
    """
    import horovod.tensorflow as hvd

    reduction = reduction_of(hvd, op, gradient_predivide_factor)
    if reduction not in ("average", "sum"):
        raise ValueError("op currently only supports Average and Sum")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be > 0")
    groups = groups_of(num_groups, groups)
    compression = unwrapped(compression)
    config = optimizer.get_config()
    if name:
        config["name"] = name
    methods = {key: value for key, value in _DistributedOptimizer.__dict__.items()
               if key not in ("__dict__", "__weakref__")}
    # named and placed as the wrapped class: Keras saves it as that class, which loads without hvdsketch
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), {**methods, "__module__": optimizer.__class__.__module__})
    wrapped = cls.from_config(config)
    exchange = gradient_exchange(hvd, compression, memory, reduction, sparse_as_dense, gradient_predivide_factor,
                                 process_set, device_dense, device_sparse, error_if_nonfinite, shared=False)
    aggregation = (None if backward_passes_per_step == 1 else
                   _Aggregation(backward_passes_per_step, average_aggregated_gradients, sparse_as_dense))
    wrapped._hvdsketch = _Setup(exchange, groups, scale_local_gradients, aggregation)
    wrapped.hvdsketch_state = ExchangeState(lambda: [exchange])
    wrapped._track_trackable(wrapped.hvdsketch_state, name="hvdsketch_state", overwrite=True)  # legacy ones too
    return wrapped


class GatherStateCallback(tf.keras.callbacks.Callback):
    """Gathers every rank's hvdsketch state (collective) where ``ModelCheckpoint`` saves, so that
    rank 0's checkpoint resumes every rank: on every rank, ahead of ``ModelCheckpoint`` in the list::

        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvdsketch.tensorflow.keras.GatherStateCallback()]
        if hvd.rank() == 0:
            callbacks.append(tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True))

    Args:
        save_freq: ``ModelCheckpoint``'s: ``"epoch"``, or a number of batches.
    """

    def __init__(self, save_freq: str | int = "epoch") -> None:
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError(f"save_freq must be 'epoch' or a positive number of batches, got {save_freq!r}")
        self.save_freq, self._batches = save_freq, 0

    def _gather(self) -> None:
        state = getattr(self.model.optimizer, "hvdsketch_state", None)
        if state is None:
            raise ValueError("hvdsketch: GatherStateCallback needs the model compiled with "
                             "hvdsketch.tensorflow.keras.DistributedOptimizer")
        state.gather()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.save_freq != "epoch":
            self._batches += 1
            if self._batches % self.save_freq == 0:
                self._gather()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.save_freq == "epoch":
            self._gather()
