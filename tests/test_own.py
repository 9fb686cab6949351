"""compare_with_retrain: the harness on a user's own LightningModule and LightningDataModule, against retraining it."""

import pytest
import torch
from helpers import toy_tensors
from helpers_own import FITS, NoTestData, PairsData, UserData, UserHead, UserNet
from lightning.pytorch.loggers import CSVLogger

from lightning_unlearn import ForgetRequest
from lightning_unlearn_bench.own import compare_with_retrain, read_data

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_fits():
    FITS.clear()


def test_retraining_your_module_has_zero_gap_your_ids_name_samples_and_every_fit_gets_the_trainer_options(tmp_path):
    logger = CSVLogger(tmp_path / "logs")
    requests = [ForgetRequest.samples([1003, 1010]), ForgetRequest.of_class(1)]
    report = compare_with_retrain(
        UserNet,
        UserData(),
        ["retrain", "finetune"],
        requests,
        options={"finetune": {"epochs": 1}},
        epochs=1,
        trainer_kwargs={"default_root_dir": str(tmp_path), "logger": logger},
        progress=False,
    )
    rows = {(r["method"], r["request"]): r for r in report.rows}
    assert rows["retrain", 1]["removed_ids"] == "1003 1010"  # the datamodule's own ids, not rows
    _, y = toy_tensors(48, seed=0)
    class_1 = torch.nonzero(y == 1).flatten() + 1000
    assert rows["retrain", 2]["removed_ids"] == " ".join(map(str, class_1.tolist()))
    for k in (1, 2):  # retraining replayed from the same initial weights and seed: the same model
        assert rows["retrain", k]["l2_to_retrain"] == 0.0 and rows["retrain", k]["certificate"] == "exact"
        assert rows["finetune", k]["l2_to_retrain"] > 0 and rows["finetune", k]["certificate"] == "none"
        assert rows["finetune", k]["reference"] == "retrain (reference)" and rows["finetune", k]["family"] == "own"
    # every fit: the reference's and the retrain method's (one per experience, then one retraining per request: 3
    # each) and finetune's (its stream, then one fine-tuning per request: 3)
    assert FITS == [(str(tmp_path), logger)] * 9


def test_acu_on_your_module_equals_retraining_its_head():
    ridge = 0.5
    report = compare_with_retrain(
        UserHead,
        UserData(),
        "acu",
        2,
        options={"acu": {"backbone": "trunk", "head": "head", "ridge": ridge}},
        progress=False,
    )
    assert {r["reference"] for r in report.rows} == {"retrain[acu] (reference)"}
    # the tolerance: both heads are float64 ridge solutions W = (R + gamma I)^-1 Q over the same features, whose
    # forward error is about eps * cond(R + gamma I) relative to ||W||; over any retained subset
    # ||W|| <= ||Q|| / gamma <= sum_i ||f_i|| / gamma and cond <= (||R_all|| + gamma) / gamma; 100x for the
    # Woodbury downdate's extra rounding and the dimension factors
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the harness seeds every run with the benchmark's seed, 0, before building the module
        module = UserHead().eval()
    x, _ = toy_tensors(48, seed=0)
    with torch.no_grad():
        f = module.head.features(module.trunk.double()(x.double()))
    f = torch.cat([f, torch.ones(len(f), 1, dtype=f.dtype)], 1)  # the bias's constant feature
    cond = (torch.linalg.matrix_norm(f.T @ f, ord=2) + ridge) / ridge
    tol = 100 * torch.finfo(torch.float64).eps * float(cond) * float(f.norm(dim=1).sum()) / ridge
    for row in report.rows:
        assert row["l2_to_retrain"] <= tol and row["certificate"] == "exact", (row["l2_to_retrain"], tol)


@pytest.mark.parametrize(
    "data, methods, options, message",
    [
        (PairsData(), "finetune", None, "batch carries no sample ids"),
        (NoTestData(), "finetune", None, "has neither test_dataloader nor val_dataloader"),
        (UserData(), "finetune", {"finetune": {"expansion_dim": 8}}, "takes no option(s) ['expansion_dim']"),
        (UserData(), "finetune", {"neggrad": {"epochs": 1}}, "not among the methods ['finetune']"),
        (UserData(), "sisa", None, "unknown method 'sisa'"),
    ],
)
def test_bad_input_is_refused_before_anything_trains(data, methods, options, message):
    with pytest.raises(ValueError) as err:
        compare_with_retrain(UserNet, data, methods, 2, options=options, progress=False)
    assert message in str(err.value)
    assert FITS == []


def test_read_data_keeps_your_ids_and_reads_the_test_loader():
    train, test = read_data(UserData(n=20))
    assert train.ids.tolist() == list(range(1000, 1020)) and len(test) == 24
    x, y = toy_tensors(20, seed=0)
    assert torch.equal(train.dataset.tensors[0], x) and torch.equal(train.dataset.tensors[1], y)
