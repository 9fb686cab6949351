"""noisy_finetune under DDP (2 CPU processes, gloo): both ranks execute the request on the whole retained set and
publish one model, whose noise is rank 0's OS-entropy draw broadcast at every step (each rank drawing its own would
publish two different models)."""

from pathlib import Path

import pytest
import torch
from helpers import run_script

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "ddp_noisy.py"


def test_both_ranks_publish_one_model_from_the_whole_retained_set(tmp_path):
    run_script(SCRIPT, tmp_path / "ddp.pt", 2)
    ranks = [torch.load(tmp_path / f"ddp.rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    a, b = ranks
    assert torch.equal(a["params"], b["params"]) and torch.equal(a["running_mean"], b["running_mean"])
    assert torch.equal(a["forgotten"], b["forgotten"]) and int(a["forgotten"].sum()) == 16
    # every rank ran the steps on all 48 retained samples (not its shard), with one calibration and accounting
    for r in ranks:
        assert r["extra"]["n_retained"] == 48 and r["extra"]["gradient_evaluations"] == 3 * 16
    assert a["sigma"] == b["sigma"] > 0 and a["epsilon_total"] == b["epsilon_total"]
