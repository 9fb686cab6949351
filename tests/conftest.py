import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite on 2 pytest-xdist workers (CI has 2 cores): one intra-op thread per worker keeps
    # them from oversubscribing the cores (a test's subprocesses set their own threads)
    import torch

    torch.set_num_threads(1)

import signal  # noqa: E402
import threading  # noqa: E402

import pytest  # noqa: E402

#: the signals tests send to their own process, and their handlers when the session (or this xdist worker) started
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_SESSION_HANDLERS = {s: signal.getsignal(s) for s in _SIGNALS}


@pytest.fixture(autouse=True)
def _session_signal_handlers():
    """Every test starts with the session's SIGINT and SIGTERM handlers, unblocked, whatever an earlier test in the
    process left (Lightning, for one, sets SIGINT to ``SIG_IGN`` when a ``KeyboardInterrupt`` ends a fit and never
    restores it). Once in `make test`, both tests that send a real Ctrl-C to their own process failed in one xdist
    worker ("DID NOT RAISE"), as they do after a test that leaves SIGINT ignored; each passes alone."""
    if threading.current_thread() is threading.main_thread():
        for s, handler in _SESSION_HANDLERS.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    yield
