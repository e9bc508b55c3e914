"""The step protocol: every rank at the same step with the same setup, checked with one small collective.

At a step's first gradient every rank sends a tag (:func:`~hvdsketch.exchange.agreement.step_message`)
through the gradients' communicator; results are handed back only once the tags agree. Between steps a
rank may check in alone (:meth:`StepProtocol.check_in`); the others answer with their next tag.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from hvdsketch.collectives import Communicator, Handle
from hvdsketch.compress import Message
from hvdsketch.exchange import agreement
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops

#: ``wait(handle, what)``: block on ``handle``, saying what for (the watchdog's report).
Wait = Callable[[Handle, str], list]


class StepProtocol:
    """The tags and check-ins of one exchanger over ``communicator``, each collective named ``name``;
    ``wait`` blocks on one. Under ``communicator.ordered`` (MPI) a check-in cannot be answered out of turn."""

    def __init__(self, communicator: Communicator, wait: Wait, name: str, checkin_seconds: float) -> None:
        self.communicator, self._wait, self.name = communicator, wait, name
        self.ordered = bool(getattr(communicator, "ordered", False))
        self.checkin_seconds = checkin_seconds
        #: The setup's digest (:meth:`hvdsketch.exchange.Exchanger.verify`), part of every tag.
        self.setup = 0
        self._tag: Handle | None = None  # this step's tag, until it is checked
        self._checkin: Handle | None = None  # a check-in the others have not answered yet

    @property
    def open(self) -> bool:
        """Whether this step's tag is out and not yet checked."""
        return self._tag is not None

    def begin(self, ops: Ops, step: int) -> None:
        """A step's first gradient: collect a pending check-in's answer, send the tag, check it if landed."""
        if self._checkin is not None:  # answered by the others' tags of this step (or their check-ins)
            checkin, self._checkin = self._checkin, None
            self._wait(checkin, "the other ranks' answer to this rank's check-in")
        self._tag = self._send_tag(ops, step)
        while self._tag is not None and self._tag.test():
            tag, self._tag = self._tag, None
            if not self.settled(tag.wait()[0], step):
                self._tag = self._send_tag(ops, step)

    def end(self, step: int) -> None:
        """Before any result is handed back: wait for this step's tag until every rank agrees."""
        tag, self._tag = self._tag, None
        while tag is not None:
            reduced = self._wait(tag, "the step check")[0]
            tag = None if self.settled(reduced, step) else self._send_tag(backend(reduced), step)

    def settled(self, tag: Any, step: int) -> bool:
        """Whether every rank sent this step's tag alike, else the same error on every rank. Where only the
        activity differs (a rank checking in alone), answer it with an empty share and return ``False``: the
        tag must go again (under ``ordered``, raise)."""
        ops = backend(tag)
        if ops.all_true([agreement.step_agrees(ops, tag)]):
            return True
        reduced = _integers(tag)
        alone = reduced[0] == -reduced[1] and reduced[2] == -reduced[3] and reduced[4] != -reduced[5]
        if not alone or self.ordered:
            raise agreement.step_error(step, self.communicator.rank, reduced)
        self._wait(self._send(agreement.share(ops, b"")), "the answer to a rank's check-in")
        return False

    def check_in(self, activity: int, share: bytes, ops: Ops, step: int) -> list[bytes] | None:
        """Every rank's ``share`` between steps, or ``None`` (:meth:`hvdsketch.exchange.Exchanger.check_in`)."""
        handle = self._checkin or self._send_tag(ops, step, activity, agreement.share(ops, share))
        self._checkin = None
        deadline = time.monotonic() + self.checkin_seconds
        while not handle.test():  # polled: the one wait that must give up
            if time.monotonic() > deadline:
                if self.ordered:
                    raise TimeoutError(f"hvdsketch: rank {self.communicator.rank} waited "
                                       f"{self.checkin_seconds:.0f} s for the other ranks' check-in")
                self._checkin = handle
                return None
            time.sleep(0.01)
        tag, sizes, data = handle.wait()
        reduced = _integers(tag)
        if ops.all_true([agreement.step_agrees(ops, tag)]):
            return agreement.shares(ops, sizes, data)
        if reduced[0] == -reduced[1] and reduced[2] == -reduced[3]:  # only the activity: the others train on
            return None
        raise agreement.step_error(step, self.communicator.rank, reduced)

    def abandon(self) -> None:
        """Forget the tag and check-in of a step broken off: they never finish."""
        self._tag = self._checkin = None

    def _send_tag(self, ops: Ops, step: int, activity: int = agreement.TRAIN,
                  payload: Sequence[Message] = ()) -> Handle:
        return self._send([agreement.step_message(ops, step, self.setup, activity), *payload])

    def _send(self, messages: Sequence[Message]) -> Handle:
        return self.communicator.start(messages, self.name)


def _integers(tag: Any) -> list[int]:
    return [int(v) for v in backend(tag).to_numpy(tag)]
