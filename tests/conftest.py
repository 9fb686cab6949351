import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite on 2 pytest-xdist workers (CI has 2 cores): one intra-op thread per worker keeps
    # them from oversubscribing the cores (a test's subprocesses set their own threads)
    import torch

    torch.set_num_threads(1)
