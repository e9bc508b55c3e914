"""hvdsketch's per-rank state in ``tf.train.Checkpoint``: one file, saved on rank 0, resumes every rank.

Error-feedback residuals and some compressors' state (DGC's velocity, PowerSGD's
warm start, EF-SignSGD's residuals) differ on every rank, while Horovod users save
on rank 0 only. An :class:`ExchangeState` is a ``tf.train.Checkpoint``-trackable
object whose saved value is every rank's state (:mod:`hvdsketch.exchange.checkpoint`):
gathering it is a collective, so every rank calls :meth:`ExchangeState.gather`
between steps and then rank 0 saves; on resume every rank restores the one file
and takes its own entry::

    state = hvdsketch.tensorflow.TapeState()     # this process's DistributedGradientTapes
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, hvdsketch=state)
    checkpoint.restore(tf.train.latest_checkpoint(folder))   # on every rank (or see broadcast)
    for step in ...:
        ... tape = hvdsketch.tensorflow.DistributedGradientTape(tape, compression="topk:ratio=0.01",
                                                             memory="fp32") ...
        if step % 100 == 0:
            state.gather()                       # every rank: collective
            if hvd.rank() == 0:
                checkpoint.save(os.path.join(folder, "ckpt"))

hvdsketch's tf-keras ``DistributedOptimizer`` tracks its own :class:`ExchangeState`
(``optimizer.hvdsketch_state``), so ``tf.train.Checkpoint(optimizer=...)`` and ``model.save_weights``
carry it; under ``model.fit`` put :class:`hvdsketch.tensorflow.keras.GatherStateCallback` on every
rank before rank 0's ``ModelCheckpoint``.

A save not gathered at this step (``if hvd.rank() == 0: checkpoint.save(...)``) carries no rank's
residuals and warns; resuming from it starts every rank's residuals afresh alike. A checkpoint of
another number of ranks or setup is a ``ValueError`` at restore (or at a tape's first step), unless
``reset_on_change=True``. Restored on rank 0 alone, :meth:`ExchangeState.broadcast` gives every rank its entry.
"""
from __future__ import annotations

import pickle
import warnings
from typing import Any, Callable

import tensorflow as tf

from hvdsketch.exchange.session import ALONE
from hvdsketch.tensorflow import gradients
from hvdsketch.tensorflow.gradients import GradientExchange, TapeExchanges

#: The version of the saved value's layout: ``{"format": 1, "exchanges": [checkpoint, ...]}``.
FORMAT = 1


class ExchangeState(tf.train.experimental.PythonState):
    """Every rank's hvdsketch state of the exchanges ``exchanges()`` gives, as a checkpoint saves it.

    Args:
        exchanges: the exchanges, in an order every rank shares (asked anew at each call: tapes
            come into being at their first step).
        tapes: where the entries of exchanges not made yet wait for their first step (``gradients.TAPES``).
        reset_on_change: restore a checkpoint of another number of ranks or compression setup by
            starting every rank's per-rank state afresh (logged on rank 0) instead of raising.
    """

    def __init__(self, exchanges: Callable[[], list[GradientExchange]], reset_on_change: bool = False,
                 tapes: TapeExchanges | None = None) -> None:
        self.exchanges, self.reset_on_change, self.tapes = exchanges, reset_on_change, tapes
        self._gathered: tuple[list[int], list[Any]] | None = None  # (each exchange's step, its checkpoint)
        self._restored: bytes | None = None

    def gather(self) -> None:
        """Collect every rank's state for the next save (collective: every rank, between steps)."""
        exchanges = self.exchanges()
        self._gathered = ([x.steps_run() for x in exchanges], [x.gather() for x in exchanges])

    def serialize(self) -> bytes:
        exchanges = self.exchanges()
        if self._gathered is not None and self._gathered[0] == [x.steps_run() for x in exchanges]:
            saved = self._gathered[1]
        else:  # a save on this rank alone: no collective
            saved = [x.session.alone() for x in exchanges]
            if exchanges:
                warnings.warn(f"hvdsketch: this checkpoint carries no rank's error-feedback residuals or compressors' "
                              f"state, which will start afresh when it is restored; {ALONE}", stacklevel=2)
        return pickle.dumps({"format": FORMAT, "exchanges": saved}, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, string_value: bytes) -> None:
        try:
            saved = pickle.loads(string_value)
        except Exception as error:  # whatever the bytes make pickle raise: not an entry hvdsketch wrote
            raise ValueError(f"hvdsketch: the checkpoint's hvdsketch entry cannot be read ({error!r}): it is not one "
                             f"hvdsketch's ExchangeState saved") from error
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise ValueError("hvdsketch: the checkpoint's hvdsketch entry is not one hvdsketch's ExchangeState saved")
        self._restored = string_value
        exchanges = self.exchanges()
        for exchange, entry in zip(exchanges, saved["exchanges"]):
            exchange.load(entry, self.reset_on_change)
        if self.tapes is not None:
            self.tapes.restored = {place: (entry, self.reset_on_change)
                                   for place, entry in enumerate(saved["exchanges"]) if place >= len(exchanges)}

    def broadcast(self, root_rank: int = 0) -> None:
        """After a restore on ``root_rank`` alone: every rank takes its own entry of what the root
        restored (collective; a root that restored nothing leaves every rank's state as it is)."""
        import horovod.tensorflow as hvd

        restored = hvd.broadcast_object(self._restored, root_rank, name="hvdsketch.state.broadcast")
        if restored is not None and hvd.rank() != root_rank:
            self.deserialize(restored)


def TapeState(reset_on_change: bool = False) -> ExchangeState:
    """The :class:`ExchangeState` of this process's :func:`DistributedGradientTape` objects, for a
    ``tf.train.Checkpoint`` (a tape made later, at its first step, takes its restored state then)."""
    return ExchangeState(gradients.TAPES, reset_on_change, gradients.TAPES)
