"""``reproduce`` goes on past a method that refuses a certified release: the refused row is written (per-setup CSV,
summary, row file) with its reason, ``--resume`` counts it as finished, the command exits 0 and lists it; any other
error still stops the run."""

import csv
import json
import math

import pytest
from helpers_repro import tiny_config

from lightning_unlearn import ReleaseRefused
from lightning_unlearn.privacy import PrivacyAccountant, Release
from lightning_unlearn_bench import loop
from lightning_unlearn_bench.cli import main
from lightning_unlearn_bench.papers import get_config
from lightning_unlearn_bench.repro import run_config

pytestmark = pytest.mark.slow

REFUSED = "{name: hf, paper_row: HF certified, options: {epsilon: 1.0, delta: 0.001, l2: 0.5, lr_margin: null}}"
RUNS = "{name: hf, paper_row: HF noise-free, options: {noise: false, l2: 0.5, lr_margin: 0.9}}"
#: the refusal [HF] Lemma 3's step-size condition makes on these digits (M = 10.33 from the data, l2 = 0.5)
WHY = "HF refuses a certified release: step size lr = 0.5 exceeds 2/(M + lambda) = 0.1846"


def _csv(path):
    with path.open() as fh:
        return {r["paper_row"]: r for r in csv.DictReader(fh)}


def test_a_refused_row_is_recorded_with_its_reason_and_the_run_goes_on(tmp_path, capsys):
    config, out = tiny_config(tmp_path / "tiny.yaml", [REFUSED, RUNS]), tmp_path / "out"
    assert main(["reproduce", str(config), "--smoke", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    # the end of the run lists the refused row with its reason; the log said so when it happened
    assert "1 row(s) refused a certified release" in printed.out and f"LR K=2 HF certified: {WHY}" in printed.out
    assert "LR K=2 HF certified: refused (" in printed.err and "LR K=2 HF noise-free: 2 request(s)" in printed.err
    # the per-setup CSV: the refused row with no numbers and its reason, the next row measured, the reference
    rows = _csv(out / "LR" / "paper_vs_ours.csv")
    assert list(rows) == ["HF certified", "HF noise-free", "Retrain"]
    refused = rows["HF certified"]
    assert refused["guarantee"].startswith(f"refused: {WHY}") and refused["refused"].startswith(WHY)
    assert all(math.isnan(float(refused[k])) for k in ("retain_acc", "forget_acc", "test_acc", "TA", "Distance"))
    assert refused["paper TA"] == "87.5" and refused["seed"] == "0" and len(refused["recipe"]) == 16
    ran = rows["HF noise-free"]
    assert ran["guarantee"] == "none" and ran["refused"] == "" and 0 <= float(ran["TA"]) <= 100
    # the summary's table: the reason in the guarantee column, our cells blank, the paper's number kept
    summary = (out / "summary.md").read_text()
    line = next(x for x in summary.splitlines() if x.startswith("| hf[eps=1,delta=0.001] | HF certified |"))
    assert line.startswith("| hf[eps=1,delta=0.001] | HF certified |  |  |  | - (87.50) | - | refused: " + WHY)
    assert "Partial" not in summary
    # the row file: the whole message, no harness rows of its own
    unit = json.loads((out / "LR" / "rows" / "K_2--HF_certified.json").read_text())
    assert unit["refused"].startswith(WHY) and unit["rows"] == [] and unit["end_rows"] == []
    # --resume counts the refused row as finished: nothing runs, no data is loaded, the same table
    assert main(["reproduce", str(config), "--smoke", "--out", str(out), "--resume"]) == 0
    again = capsys.readouterr()
    assert "HF certified: refused before (resumed)" in again.err and "HF noise-free: finished before" in again.err
    assert "training samples" not in again.err and f"LR K=2 HF certified: {WHY}" in again.out
    assert _csv(out / "LR" / "paper_vs_ours.csv") == rows


def test_the_refusal_is_its_own_type_and_still_a_value_error():
    assert issubclass(ReleaseRefused, ValueError)
    spent = PrivacyAccountant("pld", (Release(sigma=1.0, sensitivity=1.0, epsilon=1.0, delta=1e-5),))
    with pytest.raises(ReleaseRefused, match="privacy budget exceeded"):
        spent.check_budget((0.1, 1e-5))


def test_an_error_that_is_no_refusal_stops_the_run_with_the_finished_rows_kept(tmp_path, monkeypatch):
    third = "{name: hf, paper_row: HF B, options: {noise: false, l2: 0.25, lr_margin: 0.9}}"
    config, out = get_config(tiny_config(tmp_path / "tiny.yaml", [REFUSED, RUNS, third])), tmp_path / "out"
    real, calls = loop.run_method_last, []

    def third_breaks(method, *args, **kwargs):
        calls.append(method.name)
        if len(calls) == 3:
            raise ValueError("a bug, not a refusal")
        return real(method, *args, **kwargs)

    monkeypatch.setattr("lightning_unlearn_bench.repro.run.run_method_last", third_breaks)
    with pytest.raises(ValueError, match="a bug, not a refusal"):
        run_config(config, smoke=True, out=out, log=lambda _: None)
    kept = sorted(p.name for p in (out / "LR" / "rows").iterdir())
    assert kept == ["K_2--HF_certified.json", "K_2--HF_noise-free.json"]  # the refused row and the finished one
    assert "Partial: 2 of 3 rows" in (out / "summary.md").read_text()
