"""Under DDP (2 CPU processes, gloo) the HF, SAFE, [NS] and [CCL] recorders hold the same statistics as in one process,
sharded: SAFE's, [NS]'s and [CCL]'s sums are taken over each rank's own samples and added once, HF's vectors are split
between the ranks (a memory-mapped store's checkpoint restores each rank's file), and an HF request executed by
both ranks publishes the single-process model.

Tolerance: the models and statistics are float64 and only the summation order differs (sums of per-rank partial
sums instead of one sum, rank brackets added in another order over 12 steps): relative errors of a few hundred
float64 eps at most, so rtol=1e-9, atol=1e-12 (absolute floor for entries that cancel to ~0).
"""

from pathlib import Path

import pytest
import torch
from helpers import run_script

from lightning_unlearn.callbacks import TrajectoryRecorder

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "ddp_trajectory.py"
N = 96


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_ddp_statistics_equal_single_process(tmp_path):
    run_script(SCRIPT, tmp_path / "ddp.pt", 2)
    run_script(SCRIPT, tmp_path / "single.pt", 1)
    single = torch.load(tmp_path / "single.rank0.pt", weights_only=True)
    ddp = [torch.load(tmp_path / f"ddp.rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    A = dict(zip(single["shard"]["ids"].tolist(), single["shard"]["rows"]))
    assert sorted(A) == list(range(N))
    # HF: each vector on exactly one rank, equal to the single-process one; each rank holds about half
    held = [d["shard"]["ids"].tolist() for d in ddp]
    assert sorted(held[0] + held[1]) == list(range(N))
    for d in ddp:
        assert all(close(row, A[i]) for i, row in zip(d["shard"]["ids"].tolist(), d["shard"]["rows"]))
        assert abs(len(d["shard"]["ids"]) - N / 2) <= N / 8
        assert d["shard"]["memory_bytes"] <= 0.625 * single["shard"]["memory_bytes"]
    for rank, d in enumerate(ddp):
        a, b = d["trajectory"], single["trajectory"]
        assert sorted(a["row_ids"].tolist()) == sorted(b["row_ids"].tolist()) == list(range(N))
        assert a["lrs"].numel() == b["lrs"].numel() == 12 and a["batch_sizes"].tolist() == b["batch_sizes"].tolist()
        # the request: same a^{-U} and clean published model as one process; same noised model on both ranks
        assert abs(d["update_norm"] - single["update_norm"]) <= 1e-9 * single["update_norm"], rank
        assert close(d["published_clean"], single["published_clean"]), rank
        s, t = d["streaming"], single["streaming"]
        assert s["n_anchor"] == t["n_anchor"] == N and torch.equal(s["counts"], t["counts"])
        for key in ("s1", "s2", "loss_sum", "ref_mean", "ref_cov"):  # sums over all samples, not one rank's half
            assert close(s[key], t[key]), (rank, key)
        for name in t["grad_sum"]:
            assert close(s["grad_sum"][name], t["grad_sum"][name]), (rank, name)
        h, g = d["hessian_sum"], single["hessian_sum"]  # [NS]: the dense Hessian sum at the trained model
        assert h["n"] == g["n"] == N and close(h["matrix"], g["matrix"]) and close(h["theta"], g["theta"]), rank
        assert abs(h["grad_max"] - g["grad_max"]) <= 1e-9 * g["grad_max"], rank
        h, g = d["hessian"], single["hessian"]
        assert h["sizes"].tolist() == g["sizes"].tolist() == [48, 48]
        for key in ("starts", "ends", "hessians"):
            for u, v in zip(h[key], g[key]):
                assert close(u, v), (rank, key)
    # a checkpoint of a memory-mapped store: each rank reopened its own file (digest checked) with its rows
    assert ddp[0]["restored"] and ddp[1]["restored"] and single["restored"]
    assert (tmp_path / "ddp.rows.rank0").is_file() and (tmp_path / "ddp.rows.rank1").is_file()
    assert torch.equal(ddp[0]["published_noised"], ddp[1]["published_noised"])  # rank 0's noise, broadcast
    assert ddp[0]["noise_norm"] > 0 and not close(ddp[0]["published_noised"], ddp[0]["published_clean"])
    # a DDP checkpoint restores only in a DDP run of its size, and never without its ranks' files
    states = torch.load(tmp_path / "ddp.ckpt", map_location="cpu", weights_only=True)["callbacks"]
    for dtype, store, why in ((torch.float64, "memory", "store='mmap'"), (torch.float32, "mmap", "this one has 1")):
        fresh = TrajectoryRecorder(dtype=dtype, store=store, path=tmp_path / "fresh.rows", capacity=96)
        with pytest.raises(ValueError, match=why):
            fresh.load_state_dict(states[fresh.state_key])
        assert fresh.A is None and not len(fresh.catalog)
    # sharded recording: no rank computed statistics of the other's samples
    assert single["streaming_rows"] == single["hessian_sum_rows"] == N and single["hessian_rows"] == 2 * 48
    for key, total in (("streaming_rows", N), ("hessian_sum_rows", N), ("hessian_rows", 2 * 48)):
        assert ddp[0][key] + ddp[1][key] == total and max(ddp[0][key], ddp[1][key]) < total, key
