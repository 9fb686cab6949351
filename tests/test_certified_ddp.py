"""Under DDP (2 CPU processes, gloo) the HF, SAFE, [NS] and [CCL] recorders hold the same statistics as in one process,
sharded: SAFE's, [NS]'s and [CCL]'s sums are taken over each rank's own samples and added once, HF's vectors and
[CCL]'s factor rows and stored gradients are split between the ranks (a memory-mapped store's checkpoint restores
each rank's file; [CCL]'s checkpoint holds every row and reloads on any number of processes), and an HF or a
sample-level [CCL] request executed by both ranks publishes the single-process model.

Tolerance: the models and statistics are float64 and only the summation order differs (sums of per-rank partial
sums instead of one sum, rank brackets added in another order over 12 steps): relative errors of a few hundred
float64 eps at most, so rtol=1e-9, atol=1e-12 (absolute floor for entries that cancel to ~0).
"""

import math
from pathlib import Path

import pytest
import torch
from helpers import run_script
from helpers_certified import user_model

from lightning_unlearn import ForgetRequest, ReleaseConfig
from lightning_unlearn.callbacks import CCLHessianRecorder, TrajectoryRecorder
from lightning_unlearn.unlearners import CCLHessianUnlearner

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


def test_ccl_ranks_hold_their_own_factor_rows_and_gradients_and_forget_as_one_process(tmp_path):
    script = Path(__file__).parent / "scripts" / "ddp_ccl.py"
    run_script(script, tmp_path / "ddp.pt", 2)
    run_script(script, tmp_path / "single.pt", 1)
    single = torch.load(tmp_path / "single.rank0.pt", weights_only=True)
    ranks = [torch.load(tmp_path / f"ddp.rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert [r["held"]["world"] for r in ranks] == [2, 2] and single["held"]["world"] == 1
    # each rank holds the factor rows of its 30 samples of each task (K = 3 rows each), half of one process's, and
    # the stored gradients of its own samples: disjoint halves that make up one process's
    assert single["held"]["factor_rows"] == [180] * 3 and all(r["held"]["factor_rows"] == [90] * 3 for r in ranks)
    held = [set(r["held"]["sample_grad_ids"]) for r in ranks]
    assert len(held[0]) == len(held[1]) == 90 and not held[0] & held[1]
    assert held[0] | held[1] == set(single["held"]["sample_grad_ids"])
    # Tolerances: training differs from one process's by the summation order only (a few eps per step, contracted by
    # the task's gradient descent); each transport solve is within cond sqrt(d) eps of the exact one (CG's stopping
    # rule, cond <= (M + lambda) / (mu + lambda)), five solves in this request: 100 cond sqrt(d) eps ||x||
    eps, d = torch.finfo(torch.float64).eps, 21
    cond = (single["result"]["bounds"]["smoothness"] + 1.0) / (0.05 + 1.0)

    def close_to(x: torch.Tensor, reference: torch.Tensor) -> bool:
        return float((x - reference).norm()) <= 100 * cond * math.sqrt(d) * eps * float(reference.norm())

    for r in ranks:
        # a transport on the sharded factor by CG (all-reduced products) and by Woodbury (gathered rows)
        assert all(close_to(r["solves"][how], single["solves"]["cg"]) for how in ("cg", "woodbury"))
        # the request before (from the rows the fit left) and after the checkpoint was reloaded on the two ranks (each
        # keeps the rows i % 2 == rank of it): the one-process model and certificate
        for key in ("result", "reloaded"):
            got, want = r[key], single["result"]
            assert close_to(got["internal"], want["internal"]), key
            assert got["sigma"] == pytest.approx(want["sigma"], rel=1e-12) and got["sigma"] > 0
            # the measured task residual (~1e-10, "tolerance") differs by the rounding of O(1) gradient terms: abs 1e-15
            assert all(got["bounds"][k] == pytest.approx(v, rel=1e-12, abs=1e-15) for k, v in want["bounds"].items())
        assert r["reloaded"]["sample_grads"] == 90
        # refused, nothing changed: a stored gradient no rank holds, named; one held by two ranks
        assert r["bad"]["missing"]["unchanged"] and "gradients of ids [7]" in r["bad"]["missing"]["message"]
        assert r["bad"]["twice"]["unchanged"] and "samples [8] on more than one rank" in r["bad"]["twice"]["message"]
    assert single["bad"]["missing"]["unchanged"] and "gradients of ids [7]" in single["bad"]["missing"]["message"]
    # every rank ran the same iterations on the same all-reduced vectors: the same bits; and published rank 0's noise
    for how in ("cg", "woodbury"):
        assert torch.equal(ranks[0]["solves"][how], ranks[1]["solves"][how])
    for key in ("result", "reloaded"):
        assert torch.equal(ranks[0][key]["internal"], ranks[1][key]["internal"])
        assert torch.equal(ranks[0][key]["published"], ranks[1][key]["published"])
    # rank 0's state (the checkpoint Lightning writes) holds every row; rank 1's holds its own and is refused alone
    assert [len(H["factor"]) for H in ranks[0]["saved"]["hessians"]] == [180] * 3
    assert len(ranks[0]["saved"]["sample_grad_ids"]) == 180 and ranks[1]["saved"]["row_shard"] == [1, 2]
    with pytest.raises(ValueError, match="rank 1's part of a 2-process state"):
        CCLHessianRecorder(hessian="factored", store_sample_gradients=True).load_state_dict(ranks[1]["saved"])
    # the DDP checkpoint reloaded in one process: every row, and the request gives the same model and certificate
    ckpt = tmp_path / "ddp.ckpt"
    rec = CCLHessianRecorder(hessian="factored", store_sample_gradients=True).load_from_checkpoint(ckpt)
    assert [len(H["factor"]) for H in rec.hessians] == [180] * 3 and len(rec.sample_grads) == 180
    model = user_model(lr=0.5, weight_decay=0.05)
    model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"])
    unlearner = CCLHessianUnlearner(model, rec, release=ReleaseConfig(epsilon=1.0, delta=1e-5))
    certificate = unlearner.forget(ForgetRequest.samples([3, 101, 105, 110, 150])).certificate
    assert close_to(unlearner.clean_parameters(), ranks[0]["result"]["internal"])
    assert certificate.sigma == pytest.approx(ranks[0]["result"]["sigma"], rel=1e-12)
