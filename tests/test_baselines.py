"""Baseline strategies: what each trains on, that NegGrad forgets, that retraining is the exact gold standard."""

import pytest
import torch
from helpers import N_CLASSES, N_FEATURES, analytic_model, fit_analytic, quiet_trainer, toy_dataset
from torch.utils.data import DataLoader, Subset

from lightning_unlearn import ACUUnlearner, AnalyticRecorder, ForgetRequest
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.metrics import accuracy, parameter_distance
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.unlearners import (
    FinetuneUnlearner,
    NegGradPlusUnlearner,
    NegGradUnlearner,
    RandomLabelUnlearner,
    RetrainUnlearner,
)

FORGET = list(range(40))


def trained(train, epochs: int = 4):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, N_CLASSES))
    model, rec = SupervisedClassifier(net, lr=0.1), SampleRecorder()
    quiet_trainer([rec], max_epochs=epochs).fit(model, DataLoader(train, batch_size=32, shuffle=True))
    return model, rec


def weights(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_sample_recorder_catalogs_what_was_learned():
    train = toy_dataset(120, id_offset=1000)
    _, rec = trained(train, epochs=2)
    assert sorted(rec.catalog.ids.tolist()) == list(range(1000, 1120))
    assert torch.equal(rec.catalog.labels_of(torch.tensor([1000, 1001])), torch.tensor([0, 1]))


def test_neggrad_drives_forget_accuracy_down_and_is_uncertified():
    train = toy_dataset(200)
    model, rec = trained(train)
    forget = Subset(train, FORGET)
    before = accuracy(model, forget, N_CLASSES)
    assert before > 0.9
    result = NegGradUnlearner(model, rec, epochs=5, lr=0.5, batch_size=16).forget(ForgetRequest.samples(FORGET), train)
    assert accuracy(model, forget, N_CLASSES) <= before - 0.4
    assert not result.certificate.certified and result.certificate.method == "neggrad"
    assert rec.catalog.forgotten.sum() == len(FORGET)


@pytest.mark.parametrize("cls", [FinetuneUnlearner, NegGradPlusUnlearner, RandomLabelUnlearner])
def test_retained_set_excludes_the_request_and_earlier_forgotten_samples(cls):
    train = toy_dataset(200)
    model, rec = trained(train, epochs=2)
    strategy = cls(model, rec, train, epochs=1, lr=0.05)
    data = train if strategy.reads_data else None
    first = strategy.forget(ForgetRequest.samples(FORGET[:10]), data)
    second = strategy.forget(ForgetRequest.of_class(3), data)
    assert first.extra["n_retained"] == 190
    # class 3 holds 50 samples (labels are id % 4); ids 3 and 7 went with the first request
    assert second.removed_ids.numel() == 48
    assert second.extra["n_retained"] == 190 - 48
    assert not second.certificate.certified


def test_random_label_and_neggrad_plus_lower_forget_accuracy():
    train = toy_dataset(200)
    forget = Subset(train, FORGET)
    accs = {}
    for cls, kw in ((RandomLabelUnlearner, {"lr": 0.5}), (NegGradPlusUnlearner, {"lr": 0.5, "alpha": 0.5})):
        model, rec = trained(train)
        cls(model, rec, train, epochs=5, batch_size=16, **kw).forget(ForgetRequest.samples(FORGET), train)
        accs[cls.method] = accuracy(model, forget, N_CLASSES)
    assert accs["randomlabel"] < 0.6 and accs["neggrad_plus"] < 0.6, accs


class WithTask(torch.utils.data.Dataset):
    """Items ``(x, y, sample_id, task)``, as Avalanche-style forget data yields them."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        return (*self.dataset[i], 0)


@pytest.mark.parametrize("train_holds_forget", [True, False])
def test_random_label_takes_training_triples_and_forget_items_with_a_task(train_holds_forget):
    """Training items (x, y, id), forget data (x, y, id, task) (the issue's "got 3 and 4"): the samples to forget
    come from the training data when it holds them, else from the forget data cut to (x, y, id)."""
    train = toy_dataset(200)
    model, rec = trained(train)
    retained_only = Subset(train, list(range(len(FORGET), 200)))  # the training data without the samples to forget
    data = train if train_holds_forget else retained_only
    strategy = RandomLabelUnlearner(model, rec, data, epochs=5, lr=0.5, batch_size=16)
    result = strategy.forget(ForgetRequest.samples(FORGET), WithTask(train))
    assert result.extra["n_retained"] == 200 - len(FORGET)
    assert accuracy(model, Subset(train, FORGET), N_CLASSES) < 0.6  # the relabelled samples were trained on


def test_retrain_equals_acu_and_a_fresh_fit_on_the_retained_data():
    a, b = toy_dataset(120), toy_dataset(120, seed=1, id_offset=120)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    initial = weights(model)
    for ds in (a, b):
        quiet_trainer([rec]).fit(model, DataLoader(ds, batch_size=32))
    acu_model, acu_rec = fit_analytic([a, b])
    both = torch.utils.data.ConcatDataset([a, b])
    retrain = RetrainUnlearner(
        model, rec, both, initial, fit_callbacks=lambda: [AnalyticRecorder(ridge=0.5)], batch_size=32
    )
    result = retrain.forget(ForgetRequest.of_class(2))
    ACUUnlearner(acu_model, acu_rec).forget(ForgetRequest.of_class(2), both)
    assert result.certificate.exact and "retrained from scratch" in result.certificate.statement
    assert parameter_distance(model, acu_model) < 1e-8
    fresh, _ = fit_analytic(
        [
            Subset(a, torch.nonzero(a.dataset.tensors[1] != 2).flatten().tolist()),
            Subset(b, torch.nonzero(b.dataset.tensors[1] != 2).flatten().tolist()),
        ]
    )
    assert parameter_distance(model, fresh) < 1e-8


def test_retrain_of_a_trained_network_is_reproducible():
    train = toy_dataset(160)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model, rec = trained(train, epochs=1)
        torch.manual_seed(123)  # a different global RNG state must not matter
        init = weights(
            SupervisedClassifier(
                torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, N_CLASSES))
            )
        )
        RetrainUnlearner(model, rec, train, init, trainer_kwargs={"max_epochs": 2}, seed=5).forget(
            ForgetRequest.samples(FORGET)
        )
        runs.append(model)
    assert parameter_distance(*runs) == 0.0


def test_bad_input_raises_and_changes_nothing():
    train = toy_dataset(120)
    model, rec = trained(train, epochs=1)
    before = weights(model)
    with pytest.raises(ValueError, match="needs the samples to forget"):
        NegGradUnlearner(model, rec).forget(ForgetRequest.samples([1, 2]))
    with pytest.raises(ValueError, match="no retained samples"):
        FinetuneUnlearner(model, rec, train, epochs=1).forget(ForgetRequest.samples(range(120)))
    with pytest.raises(ValueError, match="training data lacks"):
        FinetuneUnlearner(model, rec, Subset(train, list(range(60))), epochs=1).forget(ForgetRequest.samples([1]))
    with pytest.raises(ValueError, match="diverg|loss became"):
        NegGradUnlearner(model, rec, epochs=50, lr=1e6, batch_size=8).forget(ForgetRequest.samples(FORGET), train)
    with pytest.raises(ValueError, match="class 9 was never learned"):
        FinetuneUnlearner(model, rec, train).forget(ForgetRequest.of_class(9))
    with pytest.raises(ValueError, match="does not read forget"):
        FinetuneUnlearner(model, rec, train).forget(ForgetRequest.samples([1]), train)
    for k, v in weights(model).items():
        assert torch.equal(v, before[k]), k
    assert rec.catalog.n_active == 120
    with pytest.raises(ValueError, match="alpha"):
        NegGradPlusUnlearner(model, rec, train, alpha=1.5)
    with pytest.raises(ValueError, match="lr > 0"):
        FinetuneUnlearner(model, rec, train, lr=0.0)
    with pytest.raises(ValueError, match="initial_state keys"):
        RetrainUnlearner(model, rec, train, {"w": torch.zeros(1)})


@pytest.mark.slow
def test_defaults_forget_a_class_as_retraining_does_in_the_harness():
    """The trained baselines and SalUn with their defaults, on the harness's default analytic family: the forgotten
    class ends within 25 points of the accuracy of retraining from scratch (0%: never learned), and retained accuracy
    stays above 90%. The only option is the batch size, 32 instead of 256, so that this tiny stream (160 samples)
    takes about as many steps per epoch as the defaults take on the digits harness (898 samples); there
    (``benchmarks/forgetting_defaults.py``) every method with its defaults, RBM included, ends the forgotten classes
    at 0-19% against retraining's 0%. RBM is left out here: it keeps the weights salient for the retained classes,
    and on these blobs the class stays at 85%. At App. E.3's rates (1e-2 / 1e-3) the four baselines left the class
    here at 57-87% (measured)."""
    from helpers_eval import tiny_info

    from lightning_unlearn.schedule import make_schedule
    from lightning_unlearn_bench import evaluate, get_method

    info = tiny_info()
    schedule = make_schedule(info.catalog(), 1, kinds=("class",), seed=0)
    names = ("finetune", "neggrad", "neggrad_plus", "randomlabel", "salun")
    report = evaluate([get_method(n, expansion_dim=48, batch_size=32) for n in names], info, schedule, shadows=0)
    (reference,) = report.reference_rows
    for name in names:
        (row,) = report.table(name)
        assert row["forget_acc"] <= reference["forget_acc"] + 0.25, (name, row["forget_acc"], reference["forget_acc"])
        assert row["retain_acc"] >= 0.9, (name, row["retain_acc"])
