"""``reproduce`` as a long job: every finished row written at once, ``--resume`` skipping the rows of the same
recipe (and only those), the run's seed and exact recipe in its outputs."""

import csv
import math
from dataclasses import replace

import pytest

from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn_bench import loop
from lightning_unlearn_bench.papers import get_config, load_config
from lightning_unlearn_bench.repro import Requests, run_config

pytestmark = pytest.mark.slow


def _config(finetune_epochs=1):
    """[ACU] Table 1's first smoke setup, two methods (ACU, fine-tuning), one request set of two requests."""
    config = get_config("acu-table1")
    setup = config.setups[0]
    smoke = replace(
        setup.smoke,
        per_class=6,
        n_experiences=2,
        pretrain_epochs=0,  # an untrained backbone: what is tested is the bookkeeping
        requests=(Requests("K=5", k=2, fraction=0.2),),
        options={"finetune": {"epochs": finetune_epochs}},
    )
    return replace(config, setups=(replace(setup, smoke=smoke, methods=setup.methods[:2]),))


def _rows(path):
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_rows_are_written_as_they_finish_and_resume_skips_them(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real = loop.run_method
    calls = []

    def second_fails(method, *args, **kwargs):
        calls.append(method.name)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(method, *args, **kwargs)

    monkeypatch.setattr("lightning_unlearn_bench.repro.run.run_method", second_fails)
    with pytest.raises(RuntimeError, match="killed"):
        run_config(_config(), smoke=True, out=out, seed=3, log=lambda _: None)
    # the first row (ACU) survived the crash: its file, the table so far and a summary saying it is partial
    setup = out / "CIFAR-10"
    assert [p.name for p in sorted((setup / "rows").iterdir())] == ["K_5--ACU.json"]
    rows = _rows(setup / "paper_vs_ours.csv")
    assert [r["paper_row"] for r in rows] == ["ACU", "Retrain"] and rows[0]["seed"] == "3"
    assert "Partial: 1 of 2 rows" in (out / "summary.md").read_text()
    assert not (setup / "paper_vs_ours.png").exists()  # figures come at the end of a setup

    monkeypatch.setattr("lightning_unlearn_bench.repro.run.run_method", real)
    lines = []
    result = run_config(_config(), smoke=True, out=out, seed=3, resume=True, log=lines.append)
    assert any("ACU: finished before (resumed)" in line for line in lines)
    assert sum("K=5 Finetuning: 2 request(s)" in line for line in lines) == 1  # only the missing row ran
    assert [r["paper_row"] for r in result.setups[0].rows] == ["ACU", "Finetuning", "Retrain"]
    assert (setup / "paper_vs_ours.png").exists() and "Partial" not in (out / "summary.md").read_text()
    first = {r["paper_row"]: r for r in _rows(setup / "paper_vs_ours.csv")}

    # everything finished: a resumed run loads no data and reproduces the same table
    lines.clear()
    again = run_config(_config(), smoke=True, out=out, seed=3, resume=True, log=lines.append)
    assert not any("training samples" in line for line in lines)
    assert again.tables == result.tables
    # a changed recipe is not skipped: fine-tuning's epochs change, ACU's row stays
    lines.clear()
    run_config(_config(finetune_epochs=2), smoke=True, out=out, seed=3, resume=True, log=lines.append)
    assert any("ACU: finished before" in line for line in lines)
    assert any("Finetuning: 2 request(s)" in line for line in lines)
    changed = {r["paper_row"]: r for r in _rows(setup / "paper_vs_ours.csv")}
    assert changed["ACU"]["recipe"] == first["ACU"]["recipe"]
    assert changed["Finetuning"]["recipe"] != first["Finetuning"]["recipe"]
    # so is another seed: every row runs again
    lines.clear()
    run_config(_config(), smoke=True, out=out, seed=4, resume=True, log=lines.append)
    assert not any("finished before" in line for line in lines)


def test_the_run_writes_its_recipe_and_estimates_the_time_left(tmp_path):
    out = tmp_path / "run"
    lines = []
    run_config(_config(), smoke=True, out=out, seed=1, log=lines.append)
    recipe = (out / "recipe.yaml").read_text()
    assert recipe.startswith("# lightning-unlearn reproduce: acu-table1, smoke scale\n# seed: 1;")
    assert load_config(out / "recipe.yaml") == _config()  # the exact config, loadable to run it again
    first = next(line for line in lines if "K=5 ACU:" in line)
    assert "1 row(s) left, ~" in first  # this run's mean time per row, times the rows left
    assert "row(s) left" not in next(line for line in lines if "K=5 Finetuning:" in line)
    with pytest.raises(ValueError, match="resume reads the finished rows of a run: give its output directory"):
        run_config(_config(), smoke=True, resume=True)
    # each request row names its release's noise and the bound it is calibrated on: none here (exact ACU, fine-tuning)
    requests = _rows(out / "CIFAR-10" / "K_5_requests.csv")
    assert {r["certificate"] for r in requests} == {"exact", "none"}
    assert {(r["sigma"], r["sensitivity"]) for r in requests} == {("nan", "nan")}


def test_a_request_row_carries_the_release_noise_and_its_bound():
    noised = Certificate(method="hf", exact=False, epsilon=1.0, delta=1e-3, sigma=0.25, bounds={"sensitivity": 2.0})
    assert loop._noise_fields(noised) == {"sigma": 0.25, "sensitivity": 2.0}
    exact = loop._noise_fields(Certificate(method="retrain", exact=True))
    assert math.isnan(exact["sigma"]) and math.isnan(exact["sensitivity"])
