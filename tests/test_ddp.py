"""Under DDP (2 CPU processes, gloo) the recorder holds the same statistics as in one process.

Each rank records only the samples it holds and the ranks' sums are added once per experience.
"""

from pathlib import Path

import pytest
import torch
from helpers import run_script

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "ddp_analytic.py"
N = 203


def test_ddp_statistics_equal_single_process(tmp_path):
    run_script(SCRIPT, tmp_path / "ddp.pt", 2)
    run_script(SCRIPT, tmp_path / "single.pt", 1)
    single = torch.load(tmp_path / "single.rank0.pt", weights_only=True)
    assert single["rows_recorded_here"] == N
    # Float64 features (the backbone runs in float64, so a row's features do not depend on its batch
    # beyond a few ulps) summed in another order: each entry of R = sum_i f_i^T f_i moves by at most
    # ~ 2 N eps sum_i |f_ia f_ib| <= 2 N eps max_a R_aa (Cauchy-Schwarz), likewise Q; T and W = T Q
    # inherit that relative error times kappa = cond(R + gamma I), taken from the single-process run.
    eps = torch.finfo(torch.float64).eps
    tol_R = 4 * N * eps * float(torch.diagonal(single["R"]).max())
    eig = torch.linalg.eigvalsh(single["R"] + 0.5 * torch.eye(len(single["R"]), dtype=torch.float64))
    rel_TW = 4 * N * eps * float(eig.max() / eig.min())
    rows = []
    for rank in (0, 1):
        ddp = torch.load(tmp_path / f"ddp.rank{rank}.pt", weights_only=True)
        assert ddp["catalog"]["ids"].sort().values.tolist() == list(range(N))  # padding counted once
        rows.append(ddp["rows_recorded_here"])
        assert float((ddp["R"] - single["R"]).abs().max()) <= tol_R, rank
        assert float((ddp["Q"] - single["Q"]).abs().max()) <= tol_R, rank
        for key in ("T", "W"):
            assert float((ddp[key] - single[key]).norm() / single[key].norm()) <= rel_TW, (rank, key)
    assert sum(rows) == N and max(rows) <= N // 2 + 1  # sharded: no rank recorded the other's samples
