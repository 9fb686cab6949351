"""Under DDP (2 CPU processes, gloo) the recorder holds the same statistics as in one process."""

from pathlib import Path

import pytest
import torch
from helpers import run_script

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "ddp_analytic.py"


def test_ddp_statistics_equal_single_process(tmp_path):
    run_script(SCRIPT, tmp_path / "ddp.pt", 2)
    run_script(SCRIPT, tmp_path / "single.pt", 1)
    single = torch.load(tmp_path / "single.rank0.pt", weights_only=True)
    for rank in (0, 1):
        ddp = torch.load(tmp_path / f"ddp.rank{rank}.pt", weights_only=True)
        assert ddp["catalog"]["ids"].sort().values.tolist() == list(range(203))  # padding counted once
        for key in ("R", "Q", "T", "W"):
            assert torch.allclose(ddp[key], single[key], rtol=1e-10, atol=1e-10), (rank, key)
