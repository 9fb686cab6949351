"""Signals across a long job: hold Ctrl-C (SIGINT) and SIGTERM across a critical section, as a database holds them
across a commit (:func:`deferred_interrupts`), stop a job promptly on SIGTERM (:func:`stop_on_sigterm`), and tell
a Ctrl-C from other ways a job ends (:func:`noting_ctrl_c`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from lightning.pytorch.utilities.exceptions import SIGTERMException

#: the signals :func:`deferred_interrupts` holds: Ctrl-C, and the polite stop of ``kill``, ``timeout`` and schedulers
HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred_interrupts(signals: Sequence[signal.Signals] = HELD) -> Iterator[None]:
    """Run the block with ``signals`` held: one that arrives inside it is delivered again, to the handler that was
    in place (``KeyboardInterrupt`` for SIGINT by default; for SIGTERM the process's, e.g. :func:`stop_on_sigterm`'s,
    or the default that ends the process), once the block has finished, never part-way through it.

    Only the main thread receives signals in Python; elsewhere the block runs as it is, and a signal whose handler
    was installed outside Python (so that it could not be put back) is not held. Exceptions raised by the block
    itself (including a ``KeyboardInterrupt`` it raises) propagate as usual.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mine = [s for s in signals if signal.getsignal(s) is not None]
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, hold) for s in mine}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)  # delivered now, to the handler the program had


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Run the block with SIGTERM raising Lightning's ``SIGTERMException`` at once, with exit status 143 (128 + 15,
    what a shell reports for a process SIGTERM ended); the handler that was in place is restored afterwards.

    Lightning's own handling (``trainer.received_sigterm``, Lightning 2.x's ``_SignalConnector``) is installed
    only while a fit runs: it sets the flag, then its loops raise ``SIGTERMException`` at the end of the training
    step or epoch, a ``SystemExit`` without a code, so a process that does not catch it ends with status 0 as if it
    had finished; outside fits (requests, metrics) SIGTERM's default ends the process with nothing said. A fit
    composes the handler it finds with its own, so inside a fit Lightning's notifier runs first (it stops the
    launcher's other ranks), then this one raises: Lightning's ``on_exception`` hooks and teardown run as for its own
    ``SIGTERMException``. Blocks under :func:`deferred_interrupts` finish first. A second SIGTERM while the block
    unwinds (``timeout`` and schedulers signal the whole process group, a wrapper may forward it too) changes
    nothing. In a thread other than the main one (which receives no signals) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if stopping:  # already stopping: the first one's exception is on its way out
            return
        stopping.append(signum)
        raise SIGTERMException(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def noting_ctrl_c() -> Iterator[list[int]]:
    """Run the block with each Ctrl-C (SIGINT) noted in the list it yields, then handled by the handler that was in
    place (Python's raises ``KeyboardInterrupt``), which is restored afterwards.

    Inside a fit Lightning turns the ``KeyboardInterrupt`` into ``sys.exit(1)`` after its ``on_exception`` hooks
    and teardown (saying so at INFO level only), and ignores SIGINT from then on: the list tells the caller that the
    ``SystemExit`` it sees was a Ctrl-C. In a thread other than the main one, or where SIGINT's handler is not a
    Python function (ignored, the default, or installed outside Python), the block runs as it is and the list
    stays empty.
    """
    noted: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield noted
        return
    handler = previous

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)
        handler(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)
