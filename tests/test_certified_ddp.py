"""Under DDP (2 CPU processes, gloo) the HF, SAFE and [CCL] recorders hold the same statistics as in one process."""

from pathlib import Path

import pytest
import torch
from helpers import run_script

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "ddp_trajectory.py"


def by_id(state: dict) -> torch.Tensor:
    order = state["row_ids"].argsort()
    return state["A"][order]


def test_ddp_statistics_equal_single_process(tmp_path):
    run_script(SCRIPT, tmp_path / "ddp.pt", 2)
    run_script(SCRIPT, tmp_path / "single.pt", 1)
    single = torch.load(tmp_path / "single.rank0.pt", weights_only=True)
    for rank in (0, 1):
        ddp = torch.load(tmp_path / f"ddp.rank{rank}.pt", weights_only=True)
        a, b = ddp["trajectory"], single["trajectory"]
        assert sorted(a["row_ids"].tolist()) == list(range(96))
        assert a["lrs"].numel() == b["lrs"].numel() == 12 and a["batch_sizes"].tolist() == b["batch_sizes"].tolist()
        # tolerance: float64, only the summation order of the batch means differs
        assert torch.allclose(by_id(a), by_id(b), rtol=1e-9, atol=1e-12), rank
        s, t = ddp["streaming"], single["streaming"]
        assert s["n_anchor"] == t["n_anchor"] == 96 and torch.equal(s["counts"], t["counts"])
        for key in ("s1", "s2", "loss_sum", "ref_mean", "ref_cov"):  # sums over all samples, not one rank's half
            assert torch.allclose(s[key], t[key], rtol=1e-9, atol=1e-12), (rank, key)
        for name in t["grad_sum"]:
            assert torch.allclose(s["grad_sum"][name], t["grad_sum"][name], rtol=1e-9, atol=1e-12), (rank, name)
        h, g = ddp["hessian"], single["hessian"]
        assert h["sizes"].tolist() == g["sizes"].tolist() == [48, 48]
        for key in ("starts", "ends", "hessians"):
            for u, v in zip(h[key], g[key]):
                assert torch.allclose(u, v, rtol=1e-9, atol=1e-12), (rank, key)
