"""Hold Ctrl-C (SIGINT) across a critical section, as a database holds it across a commit."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Run the block with SIGINT held: a Ctrl-C that arrives inside it is re-raised with the handler that was
    in place (``KeyboardInterrupt`` by default) once the block has finished, never part-way through it.

    Only the main thread receives signals in Python; elsewhere (and where SIGINT's handler was installed
    outside Python, so it could not be put back) the block runs as it is. Exceptions raised by the block
    itself (including a ``KeyboardInterrupt`` it raises) propagate as usual.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # delivered now, to the handler the program had
