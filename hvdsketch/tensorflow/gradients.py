"""The exchange of a list of TensorFlow gradients, shared by hvdsketch's tape and its tf-keras optimizer.

:func:`gradient_exchange` gives the :class:`GradientExchange` of one setup (Horovod's arguments,
:mod:`hvdsketch.tensorflow.arguments`): the same one for the same arguments (``TAPES``), since
Horovod's tape is made anew every step while the state must last. It exchanges each variable's
gradient under the variable's name, as Horovod does with local variables, ``groups`` and
``device_dense`` / ``device_sparse``; a variable without a gradient on this rank takes part with zeros.

Inside ``tf.function`` each gradient's exchange is its own ops, whose inputs are that gradient alone,
so the runtime starts a layer's collectives as soon as backward has computed its gradient; state
kept between steps lives in variables the graph reads and writes (:mod:`hvdsketch.compress.state`).
An exchange whose state a graph cannot hold (:meth:`GradientExchange.keeps_python_state`) runs in
Python ops at every step, one per gradient and one that finishes them all.
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from hvdsketch import spec
from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.compress import RowSparse, TensorContext
from hvdsketch.compress.support import values_of
from hvdsketch.digests import digest
from hvdsketch.exchange.session import Session, Tensor, create_policy, in_elastic_job
from hvdsketch.ops import tensorflow as tf_ops
from hvdsketch.tensorflow.arguments import index_groups, names_of, start_together

class TapeExchanges:
    """This process's tape exchanges: one per setup, shared by the tapes Horovod's habit makes anew
    every step, in the order they were made, and the checkpoint entries restored for those not made yet."""

    def __init__(self) -> None:
        self.by_setup: dict[tuple, GradientExchange] = {}
        self.made: dict[str, int] = {}  # setup -> exchanges of it made so far (names its collectives)
        #: The restored entry (and its ``reset_on_change``) of each exchange not made yet, by its place.
        self.restored: dict[int, tuple[Any, bool]] = {}

    def __call__(self) -> list[GradientExchange]:
        return list(self.by_setup.values())

    def claim(self, exchange: GradientExchange) -> None:
        """Give ``exchange`` (at its first step) the entry restored for its place, if any."""
        place = list(self.by_setup.values()).index(exchange)
        if place in self.restored:
            exchange.load(*self.restored.pop(place))

    def clear(self) -> None:
        self.by_setup.clear()
        self.made.clear()
        self.restored.clear()


#: The tape exchanges of this process (:func:`hvdsketch.tensorflow.TapeState` saves and restores them).
TAPES = TapeExchanges()


@tf.autograph.experimental.do_not_convert  # called where a tape is made, inside tf.function too: plain Python
def gradient_exchange(hvd: Any, compression: Any, memory: Any, reduction: str, sparse_as_dense: bool,
                      gradient_predivide_factor: float, process_set: Any, device_dense: str,
                      device_sparse: str, error_if_nonfinite: bool = False, shared: bool = True) -> "GradientExchange":
    """The :class:`GradientExchange` of this setup: with ``shared``, the one of this process (made at
    the first call), for the tapes made anew every step; else a new one (an optimizer's own).

    ``compression`` (after :func:`hvdsketch.policy.flag.unwrapped`) names the setup: a flag by the flag in force,
    rules by their text, an object by its identity."""
    process_set = hvd.global_process_set if process_set is None else process_set
    flag = spec.resolve(compression) if compression is None else compression
    key = (_identity(flag), _identity(memory), reduction, sparse_as_dense, gradient_predivide_factor,
           process_set.process_set_id, device_dense, device_sparse, error_if_nonfinite)
    if shared and key in TAPES.by_setup:
        return TAPES.by_setup[key]
    policy = create_policy(compression)
    setup = "|".join(map(str, (policy, memory, *key[2:])))
    made = TAPES.made[setup] = TAPES.made.get(setup, -1) + 1
    # named by the setup (and how many of it came before), so that a rank that made other exchanges
    # first (say, after an error) still names the collectives of this one as the other ranks do
    prefix = f"hvdsketch_{digest(setup, bits=24):06x}" + (f"_{made}" if made else "")
    communicator = HorovodCommunicator(hvd, process_set, predivide=gradient_predivide_factor)
    exchange = GradientExchange(device_dense, device_sparse)
    exchange.session = Session(policy, memory, communicator, tf_ops, op=reduction, sparse_as_dense=sparse_as_dense,
                               prefix=prefix, placement=exchange.placement, error_if_nonfinite=error_if_nonfinite)
    if shared:
        exchange.keep = (compression, memory)  # the objects whose identity is in the key stay alive
        exchange.tapes = TAPES
        TAPES.by_setup[key] = exchange
    return exchange


def _identity(argument: Any) -> Any:
    if argument is None or isinstance(argument, str):
        return argument
    if isinstance(argument, (Mapping, list)):
        return repr(argument)
    return ("object", id(argument))


class GradientExchange:
    """Exchanges the gradients of a list of variables through one :class:`~hvdsketch.exchange.session.Session`."""

    session: Session

    def __init__(self, device_dense: str = "", device_sparse: str = "") -> None:
        self.device_dense, self.device_sparse = device_dense, device_sparse
        #: Set by Horovod elastic's sync: the next exchange agrees anew with the ranks of the new world.
        self.rejoin = False
        #: The registry of a tape's exchange, whose restored entry it takes at its first step.
        self.tapes: TapeExchanges | None = None
        self._devices: dict[str, str] = {}  # tensor name -> device of its exchange this step
        with tf.init_scope():  # made eagerly, even where the first tape is made inside tf.function
            #: Bytes sent, their dense equivalent and steps, added up by each traced graph as it runs.
            self._graph_counts = tf.Variable(tf.zeros(3, tf.int64), trainable=False, name="hvdsketch_counts")
        self._sent_at_traces = 0  # bytes the communicator counted while tracing: once a trace, not a step
        self._dense_in_python = 0  # dense bytes of the exchanges run in Python (eagerly, or in Python ops)

    def placement(self, name: str) -> Any:
        device = self._devices.get(name, "")
        return tf.device(device) if device else contextlib.nullcontext()

    @tf.autograph.experimental.do_not_convert  # plain Python over ops: autograph would only slow tracing down
    def __call__(self, grads: Sequence[Any], sources: Sequence[Any], groups: Any = None, local: Any = frozenset(),
                 scale_local_gradients: bool = True, generic_names: bool = False) -> list[Any]:
        """``grads`` (of ``sources``, ``None`` where a source has none) reduced across the process
        set; the sources whose ``ref()`` is in ``local`` keep their own gradients."""
        session = self.session
        if self.tapes is not None:
            self.tapes, tapes = None, self.tapes
            tapes.claim(self)
        grads = list(grads)
        if not session.communicator.process_set.included():  # as in Horovod: outside the set, local gradients
            return grads
        names = names_of(sources, generic_names)
        shapes = [tuple(int(d) for d in s.shape) for s in sources]
        shared = [i for i, s in enumerate(sources) if s.ref() not in local]

        def begin() -> None:  # where a world begins, every rank agrees, eagerly
            session.begin(lambda: _described(sources, names, shapes, shared), rejoin=self.rejoin, scope=tf.init_scope)
            self.rejoin = False

        begin()
        for i in shared:  # no gradient on this rank (a branch others take): take part with zeros, as in PyTorch
            if grads[i] is None:
                grads[i] = _zeros_like(sources[i])
        inputs = {names[i]: _as_hvdsketch(grads[i]) for i in shared}
        self._decide_if_traced(inputs, shapes, shared)
        for group in index_groups(groups, sources, shared):
            start_together(grads, group)
            inputs.update({names[i]: _as_hvdsketch(grads[i]) for i in group})
        self._devices = {names[i]: self.device_sparse if isinstance(grads[i], tf.IndexedSlices) else self.device_dense
                         for i in shared}
        dense = sum(math.prod(shapes[i]) * sources[i].dtype.size for i in shared)
        if not tf.executing_eagerly() and self.keeps_python_state():
            averaged = self._in_python({names[i]: grads[i] for i in shared}, begin, dense)
        else:
            sent = session.communicator.stats.bytes_sent
            averaged = session.exchange(inputs)
            self._count(session.communicator.stats.bytes_sent - sent, dense)
        for i in shared:
            grads[i] = _as_tf(averaged[names[i]])
        if scale_local_gradients and len(shared) < len(grads):
            size = session.communicator.size
            for i in set(range(len(grads))) - set(shared):
                grads[i] = None if grads[i] is None else _scaled(grads[i], 1 / size)
        return grads

    def _count(self, sent: int, dense: int) -> None:
        """Count one exchange: in Python where it runs in Python, else by the graph at each run."""
        if tf.executing_eagerly():
            self._dense_in_python += dense
        else:
            self._sent_at_traces += sent
            stood = tf.cast(self.session.stood, tf.int64)  # a step left without trace is no step
            self._graph_counts.assign_add(tf.stack([tf.constant(sent, tf.int64), tf.constant(dense, tf.int64), stood]))

    def steps_run(self) -> int:
        """Steps run, eager or by traced graphs: the exchanger's step, advanced now by the steps
        traced graphs ran since (left as it is while a graph is built: Keras traces its saves)."""
        session = self.session
        with tf.init_scope():
            ran = int(self._graph_counts[2].numpy()) if tf.executing_eagerly() else 0
            if ran:
                session.step += ran
                self._graph_counts.assign_sub(tf.constant([0, 0, ran], tf.int64))
        return session.step

    def report(self) -> dict[str, Any]:
        """What compression saved on this rank (:meth:`hvdsketch.exchange.session.Session.report`), every
        step counted, eager or inside ``tf.function`` (a traced step counts the bytes its trace sent;
        where an allgather's size is known only at run time, equal shares)."""
        steps = self.steps_run()
        sent, dense, _ = (int(v) for v in self._graph_counts.numpy())
        return self.session.report(self._dense_in_python + dense,
                                   sent=self.session.communicator.stats.bytes_sent - self._sent_at_traces + sent,
                                   steps=steps)

    def keeps_python_state(self) -> bool:
        """Whether the exchange keeps state between steps that a traced graph cannot hold: a compressor
        that is not :meth:`~hvdsketch.compress.Compressor.traceable` (the sketch sized anew every step,
        whose size changes its messages' shapes; DGC; PowerSGD without warm start; ``balanced``, sized
        on the host between its rounds), residual memory other than ``fp32`` (or planned); and under
        Horovod elastic every exchange, since a graph would keep the world size it was traced in.
        Residuals, PowerSGD's ``Q`` and the other fixed-shape state a graph holds in variables."""
        return in_elastic_job() or not self.session.traceable()

    def _in_python(self, grads: dict[str, Any], begin: Callable[[], None], dense: int) -> dict[str, tf.Tensor]:
        """Inside ``tf.function``, for an exchange that :meth:`keeps_python_state`: the exchange runs in
        Python ops (``tf.py_function``) at every step, eagerly, so its state advances step by step as
        outside a function, and it still overlaps backward: each gradient's exchange starts in an op of
        its own, whose one input is that gradient, and one more op, after every start, finishes them
        all and gives the averages (dense). ``tf.function`` runs ops with side effects, these too, in
        the order they were made, so the starts are made in the order backward computes the
        gradients, the last variable's first: the runtime starts each as soon as its gradient exists.
        ``begin()`` (the ranks' agreement where a world begins) runs at each step's first start."""
        session = self.session

        def abandoning(run: Callable[..., Any]) -> Callable[..., Any]:
            def guarded(*args: Any) -> Any:
                try:
                    return run(*args)
                except BaseException:
                    session.abandon()  # no flight of a broken step is left for the next one
                    raise
            return guarded

        def start(name: str, like: Any) -> Callable[..., tf.Tensor]:
            def run(*flat: tf.Tensor) -> tf.Tensor:
                if not session.in_flight:
                    begin()
                session.start(name, _as_hvdsketch(tf.nest.pack_sequence_as(like, list(flat), expand_composites=True)))
                return tf.constant(True)
            return abandoning(run)

        started = [tf.py_function(start(name, grad), tf.nest.flatten(grad, expand_composites=True), Tout=tf.bool,
                                  name="hvdsketch_start")
                   for name, grad in reversed(grads.items())]

        @abandoning
        def finish(*_: tf.Tensor) -> list[tf.Tensor]:
            averaged = session.finish()
            self._count(0, dense)  # eagerly: the communicator counted what was sent
            return [tf.convert_to_tensor(_as_tf(averaged[name])) for name in grads]

        outs = tf.py_function(finish, started, Tout=[grad.dtype for grad in grads.values()], name="hvdsketch_finish")
        for out, grad in zip(outs, grads.values()):
            out.set_shape(_dense_shape(grad))
        return dict(zip(grads, outs))

    # -- checkpoints (hvdsketch.tensorflow.state) and Horovod elastic (hvdsketch.tensorflow.elastic) --

    def gather(self) -> dict[str, Any] | None:
        """Every rank's state in one checkpoint (collective; ``None`` outside the process set)."""
        if not self.session.communicator.process_set.included():
            return None
        self.steps_run()  # the steps traced graphs ran count in the checkpoint
        with tf.init_scope():
            return self.session.gather()

    def load(self, saved: Mapping[str, Any] | None, reset_on_change: bool = False) -> None:
        """This rank's entry of :meth:`gather`'s checkpoint (see
        :func:`hvdsketch.exchange.checkpoint.resolve` for another world or setup)."""
        if saved is None or not self.session.communicator.process_set.included():
            return
        states = self.session.resolve(saved, reset_on_change)
        self.load_local_state(states[self.session.communicator.rank])

    def local_state(self) -> dict[str, Any]:
        """A copy of this rank's state alone (no communication): what Horovod elastic commits."""
        self.steps_run()  # the steps traced graphs ran count in it
        return copy.deepcopy(self.session.state_dict())

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`local_state` (or a rank's entry of a checkpoint), forgetting any step
        broken off."""
        self.session.abandon()
        with tf.init_scope():
            self.session.load_state_dict(copy.deepcopy(state), _tensor)

    def _decide_if_traced(self, inputs: dict[str, Any], shapes: list[tuple[int, ...]], present: list[int]) -> None:
        """A graph keeps its compressors: a policy yet to decide decides now, on eager stand-ins."""
        session = self.session
        if not (session.policy.pending and inputs and tf_ops.is_symbolic(values_of(next(iter(inputs.values()))))):
            return
        with tf.init_scope():
            contexts = [TensorContext(name, shapes[i], session.step, session.communicator.size,
                                      session.communicator.rank) for name, i in zip(inputs, present)]
            session.decide([(_stand_in(g, ctx.shape), ctx) for g, ctx in zip(inputs.values(), contexts)])


def _described(sources: Sequence[Any], names: list[str], shapes: list[tuple[int, ...]],
               shared: list[int]) -> list[Tensor]:
    """The sources as the ranks compare them where a world begins: dtypes too, and which are local."""
    exchanged = set(shared)
    return [Tensor(names[i], shapes[i], source.dtype.name,
                             "" if i in exchanged else "a local source: register_local_source / register_local_var")
            for i, source in enumerate(sources)]


def _scaled(grad: Any, factor: float) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor


def _zeros_like(source: Any) -> tf.Tensor:
    """Zeros for a source without a gradient on this rank. Inside ``tf.function`` they are computed from
    the source's value: constant zeros would let TensorFlow fold the collective they feed into the graph
    when it optimizes it, and the other ranks would wait for this rank's collective forever."""
    return tf.zeros_like(source) if tf.executing_eagerly() else tf.convert_to_tensor(source) * 0


def _dense_shape(grad: Any) -> tf.TensorShape:
    """The static shape of ``grad`` as a dense tensor."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.TensorShape(tf.get_static_value(grad.dense_shape))
    return grad.shape


def _as_hvdsketch(grad: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        shape = tuple(int(d) for d in tf.get_static_value(grad.dense_shape))
        return RowSparse(tf.cast(grad.indices, tf.int64), grad.values, shape)
    return grad


def _stand_in(grad: Any, shape: tuple[int, ...]) -> Any:
    """An eager tensor like the traced gradient ``grad``: random normal values of its dtype; for a
    row-sparse one, distinct rows as many as its static count of looked-up rows (all if unknown)."""
    if isinstance(grad, RowSparse):
        dtype = grad.values.dtype
        looked_up = grad.values.shape[0] if grad.values.shape.rank else None
        rows = min(shape[0], looked_up or shape[0])
        indices = tf.range(rows, dtype=tf.int64) * (shape[0] // max(rows, 1))
        return RowSparse(indices, tf.random.normal((rows, *shape[1:]), dtype=dtype), shape)
    if not grad.dtype.is_floating:
        return tf.zeros(shape, grad.dtype)
    return tf.random.normal(shape, dtype=grad.dtype)


def _tensor(name: str, array: Any) -> tf.Tensor:
    """A checkpoint's array as an eager tensor (its first use moves it to its gradient's device)."""
    return tf.constant(array)


def _as_tf(averaged: Any) -> Any:
    if isinstance(averaged, RowSparse):
        return tf.IndexedSlices(averaged.values, averaged.indices, tf.constant(averaged.dense_shape, tf.int64))
    return averaged


__all__ = ["GradientExchange", "gradient_exchange"]
