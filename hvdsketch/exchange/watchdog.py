"""Say so when a rank waits too long for its collectives, without polling the wait itself.

A thread prints what the exchanger waits for every ``seconds`` while a wait lasts, and ends the process once
it lasts ``limit`` (:func:`shutdown_seconds`): the main thread is blocked in C++, where no exception reaches.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator


#: Horovod's settings: seconds until a stalled job is shut down (unset or 0: never), and until a stall is reported.
SHUTDOWN, CHECK = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS"


def report_seconds() -> float:
    """Seconds a wait lasts before it is reported: ``HVDSKETCH_STALL_SECONDS``, else :data:`CHECK`'s, else 60."""
    return float(os.environ.get("HVDSKETCH_STALL_SECONDS") or os.environ.get(CHECK) or 60)


def shutdown_seconds() -> float:
    """The stall limit ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` gives, as Horovod reads it (0: none)."""
    text = os.environ.get(SHUTDOWN, "").strip() or "0"
    try:
        return max(0.0, float(text))
    except ValueError:
        raise ValueError(f"hvdsketch: {SHUTDOWN}={text!r} is not a number of seconds") from None


class Watchdog:
    """Reports, every ``seconds``, a wait still going on; ends the process once it lasts ``limit`` (0: never)."""

    def __init__(self, seconds: float, limit: float = 0.0) -> None:
        self.seconds, self.limit = seconds, limit
        self._lock = threading.Lock()
        self._since: float | None = None
        self._describe: Callable[[float], str] | None = None
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, describe: Callable[[float], str]) -> Iterator[None]:
        """While the block runs, ``describe(seconds waited)`` is printed every ``seconds``."""
        with self._lock:
            self._since, self._describe = time.monotonic(), describe
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hvdsketch-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._since = self._describe = None

    def _run(self) -> None:
        session, due = None, 0.0
        while True:
            time.sleep(min(1.0, self.seconds / 4))
            with self._lock:
                since, describe = self._since, self._describe
            if since is None or describe is None:
                continue
            if since != session:
                session, due = since, since + self.seconds
            now = time.monotonic()
            if self.limit and now - since >= self.limit:
                print(f"{describe(now - since)}; ending this rank after the stall limit {SHUTDOWN}="
                      f"{self.limit:g}", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(1)
            if now >= due:  # on the schedule since + k * seconds, however late this thread wakes
                due += self.seconds * (1 + (now - due) // self.seconds)
                print(describe(now - since), file=sys.stderr, flush=True)
