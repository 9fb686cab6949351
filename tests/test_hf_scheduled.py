"""[HF] Table 6, CIFAR-10 ResNet-18: the recorder tracks only the scheduled samples, which changes none of them."""

import math
from dataclasses import replace

import pytest
import torch
from helpers_certified import blobs, fit_hf, sgd_model

from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn_bench.papers import get_config
from lightning_unlearn_bench.repro import SCHEDULED, Entry, Requests, Scale, classifier, make_method, run_config


def test_tracking_a_subset_gives_the_same_vectors_as_tracking_every_sample():
    # Eq. (10) moves each vector with its own sample's gradient and the shared step Hessian only, so the
    # rows of a tracked subset equal those of a full recording: float64, up to the rounding of HVPs batched
    # over another number of rows (measured ~1e-16 relative; 1e-12 of the rows' scale allowed)
    ds, subset = blobs(64, seed=3), [3, 17, 40, 63]
    full, part = (
        TrajectoryRecorder(dtype=torch.float64, hessian="hvp"),
        TrajectoryRecorder(dtype=torch.float64, hessian="hvp", track=subset),
    )
    fit_hf(sgd_model(), ds, full, epochs=2)
    fit_hf(sgd_model(), ds, part, epochs=2)
    assert part.n_rows == len(subset) and full.n_rows == 64
    a = full.A[[full.row_of[i] for i in subset]]
    b = part.A[[part.row_of[i] for i in subset]]
    assert float(a.abs().max()) > 0 and torch.allclose(a, b, rtol=0, atol=1e-12 * float(a.abs().max()))
    assert part.memory_bytes() == len(subset) * a.shape[1] * 8


def test_scheduled_tracking_needs_the_schedule():
    entry = Entry("hf", "HF", {"family": "supervised", "track": SCHEDULED}, relax_families=True)
    with pytest.raises(ValueError, match="track='scheduled' needs the scheduled ids"):
        make_method(entry, entry.options, {})
    assert make_method(entry, entry.options, {}, [4, 2]).name.startswith("hf")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:BatchNorm layers .* train with batch statistics")
@pytest.mark.filterwarnings("ignore:HF recipe outside the theorem")
def test_table6_resnet18_row_runs_end_to_end_on_cifar10_files(tmp_path):
    from lightning_unlearn_bench.fake_data import write_fake_dataset

    torch.set_num_threads(1)
    # one SGD step of a real ResNet-18 (CIFAR stem) on 10 CIFAR-10 files' images (one per class): HF's step costs
    # ~3 HVPs of the batch and a BatchNorm-aware per-sample gradient per tracked occurrence
    root = write_fake_dataset("split-cifar10", tmp_path / "data", per_class=1, test_per_class=1)
    setup = next(s for s in get_config("hf-table6").setups if s.label == "CIFAR-10 ResNet-18")
    scale = Scale(
        "split-cifar10",
        "resnet18",
        epochs=1,
        lr=0.001,
        batch_size=10,
        requests=(Requests("50 single", k=2, per_request=1, compare="last"),),
        only=("HF",),
    )
    config = replace(get_config("hf-table6"), setups=(replace(setup, smoke=scale),), smoke_setups=1)
    result = run_config(config, root=root, smoke=True, log=lambda _: None)
    rows = {r["paper_row"]: r for r in result.setups[0].rows}
    hf, ref = rows["HF"], rows["Retrain"]
    for column in ("TA", "Distance", "Storage(GB)", "MIA-L", "Speedup", "s/sample"):
        assert math.isfinite(hf[column]), column
    assert math.isfinite(ref["TA"]) and 0.0 <= hf["MIA-L"] <= 1.0
    # two tracked rows (the two scheduled samples) of d float32 entries, d the ResNet-18's parameters
    d = sum(p.numel() for p in classifier("resnet18", 10, (3, 32, 32), 64).parameters())
    raw = result.setups[0].reports["50 single"].rows[0]
    assert raw["storage_bytes"] == 2 * d * 4 and hf["Storage(GB)"] == pytest.approx(2 * d * 4 / 1e9, rel=1e-12)
    assert raw["n_removed"] == 2 and hf["paper Storage(GB)"] == pytest.approx(50 * 0.043)
