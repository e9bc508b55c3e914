"""Say so when a rank waits too long for its collectives, without polling the wait itself.

Waiting for a collective blocks in the communicator (Horovod's ``synchronize``
waits in C++), which is what the fastest steps need. A watchdog thread looks,
once a second, at what the exchanger is waiting for, and prints it every
``seconds`` while the wait lasts: a rank that waits for an exchange another rank
never starts names the exchange instead of hanging in silence.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator


class Watchdog:
    """Reports, every ``seconds``, a wait that is still going on."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
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
            if now >= due:
                due = now + self.seconds
                print(describe(now - since), file=sys.stderr, flush=True)
