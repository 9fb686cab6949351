import os
import signal
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite on 2 pytest-xdist workers (CI has 2 cores): one intra-op thread per worker keeps
    # them from oversubscribing the cores (a test's subprocesses set their own threads)
    import torch

    torch.set_num_threads(1)

#: the signals tests send to their own process, and the handlers every test starts with: Python's own Ctrl-C
#: handler (a process started in the background by a shell, e.g. `make test &`, inherits SIGINT ignored, and Python
#: then leaves it ignored), and SIGTERM's handler when the session (or this xdist worker) started
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_START_HANDLERS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.getsignal(signal.SIGTERM)}


@pytest.fixture(autouse=True)
def _start_signal_handlers():
    """Every test starts with :data:`_START_HANDLERS`, SIGINT and SIGTERM unblocked, whatever the shell or an earlier
    test left (Lightning, for one, sets SIGINT to ``SIG_IGN`` when a ``KeyboardInterrupt`` ends a fit and never
    restores it): the tests that send a real Ctrl-C to their own process failed ("DID NOT RAISE") when `make test`
    ran in the background, where SIGINT is inherited ignored."""
    if threading.current_thread() is threading.main_thread():
        for s, handler in _START_HANDLERS.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    yield
