"""Under DDP (2 CPU processes, gloo) the attack metrics, logged from a user's validation_step, hold the values of one
process that saw every sample: their states are gathered once, at compute, and every value is order-free."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from helpers import run_script

from lightning_unlearn.functional import metrics
from lightning_unlearn.metrics import LossThresholdMIA, MIAUnlearning, OfflineLiRA

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "ddp_metrics.py"


def one_process_values() -> dict[str, float]:
    """The metrics fed every sample of the script's data at once, in this process."""
    spec = importlib.util.spec_from_file_location("ddp_metrics", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out, role = script.outputs(), script.outputs()["role"]
    mia, lira, mia_u = LossThresholdMIA(), OfflineLiRA(), MIAUnlearning(num_classes=script.C)
    for k, name in enumerate(("target", "member", "nonmember")):
        mia.update(out["loss"][role == k], name)
    audit = role != 1
    target = metrics.logit_confidence(out["probs"][audit], out["labels"][audit])
    shadows = torch.stack([metrics.logit_confidence(p[audit], out["labels"][audit]) for p in out["shadow"]])
    gaps = metrics.lira_offline_scores(target, shadows).sort().values.diff()
    # a rank computes each score in a batch of its own, which can move it by an ulp: with no two scores within
    # 1e-9, that cannot reorder them, and the ROC (hence AUC and TPRs) is the same to the last bit
    assert float(gaps.min()) > 1e-9
    lira.update(out["probs"][audit], out["shadow"][:, audit], out["labels"][audit], role[audit] == 0)
    mia_u.update(out["before"][audit], out["after"][audit], role[audit] == 0)
    return {
        **{f"lira_{k}": float(v) for k, v in lira.compute().items()},
        "mia_u": float(mia_u.compute()),
        "logged/mia": float(mia.compute()),
    }


def test_synced_attack_metrics_equal_one_process(tmp_path):
    expected = one_process_values()
    assert all(math.isfinite(v) for v in expected.values())
    assert 0.5 < expected["lira_auc"] < 1.0 and 0.5 < expected["mia_u"] <= 1.0  # the outputs leak: not a vacuous 0.5
    run_script(SCRIPT, tmp_path / "ddp.pt", 2)
    for rank in (0, 1):
        ddp = torch.load(tmp_path / f"ddp.rank{rank}.pt", weights_only=True)
        assert ddp["rank"] == rank
        # the same per-sample numbers (float64, carried by the samples), gathered: equal to the last bit
        assert {k: ddp[k] for k in expected} == expected, rank
        assert ddp["logged/lira_auc"] == expected["lira_auc"]
