"""``reproduce ... --trainer.accelerator cpu --trainer.devices 2``: the multi-device path of a GPU run, on gloo.

Lightning's launcher runs the whole command on both ranks; every fit (continual learning, the reference's
retraining, the baselines' own Trainers) runs on both processes, the outputs are written once, by rank 0,
and the exact rows of the table are those of the one-process run.
"""

import csv
import json
import math
from pathlib import Path

import lightning as L
import pytest
from helpers import ddp_repro_config, run_cli_script

from lightning_unlearn_bench.repro import run_config

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "ddp_repro.py"
# ACU's head and the ridge retrain are solved in float64 from float32 features; a feature row depends on the batch
# it is computed in by ~1 float32 ulp, so the two runs' heads differ by ~1e-7 relative and ACU's distance to its
# own run's retrain stays at float64 rounding (~1e-13 measured) in both, far below this bound.
EXACT = 1e-8
# exact rows: accuracies, the loss-threshold MIA and offline LiRA's AUC (shadows: the exact retrain on seeded halves)
# are counts of argmax/threshold/ranking decisions, equal unless a logit margin or two samples' scores lie within
# ~1e-6 relative of each other. (MIA-U's random forest is not compared: it is fitted on posterior changes of
# samples the requests barely move, whose ordering float noise decides.)
SAME = ("removed_ids", "n_removed", "certificate", "retain_acc", "forget_acc", "test_acc", "mia", "lira_auc")
TABLE = ("retain_acc", "forget_acc", "test_acc", "dRetain", "dForget", "dTest", "dMIA", "MIA-L", "guarantee")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_two_cpu_processes_give_the_one_process_table_and_write_once(tmp_path, monkeypatch):
    fits: list[int] = []
    fit = L.Trainer.fit

    def recorded(trainer: L.Trainer, *args, **kwargs):
        fits.append(trainer.world_size)
        return fit(trainer, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "fit", recorded)
    run_config(ddp_repro_config(), smoke=True, out=tmp_path / "one", log=lambda _: None)

    proc = run_cli_script(SCRIPT, str(tmp_path / "two"), "2", cwd=tmp_path)
    ranks = [json.loads((tmp_path / f"two.rank{r}.json").read_text()) for r in (0, 1)]
    # every fit, the baselines' and the retrain's included, ran on both processes: those of one process, after a
    # first that starts the ranks (start_ranks)
    assert set(fits) == {1} and all(r["fits"] == [2] * (len(fits) + 1) for r in ranks)
    # rank 0 wrote every output file (the tables again as each row finished; replaced through a .tmp file), rank 1
    # nothing; the tables were printed once
    written = sorted({name.removesuffix(".tmp") for name in ranks[0]["opened"]})
    assert written == _files(tmp_path / "two") == _files(tmp_path / "one")
    assert ranks[1]["opened"] == [] and proc.stdout.count("acu [ACU]") == 1
    # torch deprecates the all_gather Lightning calls: its warning, which nobody running this can act on, is not shown
    assert "all_gather is deprecated" not in proc.stderr

    one, two = (_rows(tmp_path / run / "CIFAR-10" / "K_2_requests.csv") for run in ("one", "two"))
    assert [r["method"] for r in one] == [r["method"] for r in two]
    exact = [(a, b) for a, b in zip(one, two) if a["method"] in ("acu", "retrain (reference)")]
    assert len(exact) == 4  # two requests each
    for a, b in exact:
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}, a["method"]
        if a["method"] == "acu":
            assert float(a["l2_to_retrain"]) < EXACT and float(b["l2_to_retrain"]) < EXACT
    one, two = (_rows(tmp_path / run / "CIFAR-10" / "paper_vs_ours.csv") for run in ("one", "two"))
    assert [r["method"] for r in one] == [r["method"] for r in two]
    for a, b in zip(one, two):
        if a["method"] in ("acu", "retrain (reference)"):
            assert {k: a[k] for k in TABLE} == {k: b[k] for k in TABLE}, a["method"]
            assert math.isnan(float(a["dParams"])) or max(float(a["dParams"]), float(b["dParams"])) < EXACT
