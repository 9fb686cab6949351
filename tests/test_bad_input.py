"""Bad requests raise a ValueError naming the problem and change nothing."""

import numpy as np
import pytest
import torch
from helpers import analytic_model, fit_analytic, toy_dataset

from lightning_unlearn import ACUUnlearner, AnalyticRecorder, ForgetRequest, Ledger


@pytest.fixture()
def fitted():
    data = toy_dataset(120)
    model, rec = fit_analytic([data])
    strategy = ACUUnlearner(model, rec, Ledger())
    strategy.forget(ForgetRequest.samples([3]), data)
    return strategy, data


def snapshot(strategy):
    rec = strategy.recorder
    return (
        {k: v.clone() for k, v in strategy.module.state_dict().items()},
        {k: getattr(rec, k).clone() for k in "RQTW"},
        rec.catalog.forgotten.clone(),
        len(strategy.ledger),
    )


def assert_unchanged(strategy, before):
    params, stats, forgotten, n_ledger = before
    for k, v in strategy.module.state_dict().items():
        assert torch.equal(v, params[k]), k
    for k, v in stats.items():
        assert torch.equal(getattr(strategy.recorder, k), v), k
    assert torch.equal(strategy.recorder.catalog.forgotten, forgotten)
    assert len(strategy.ledger) == n_ledger


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (ForgetRequest.samples([5, 10_000]), "unknown sample ids"),
        (ForgetRequest.samples([3]), "already forgotten"),
        (ForgetRequest.of_class(9), "class 9 was never learned"),
        (ForgetRequest.of_experience(4), "experience 4 was never learned"),
    ],
)
def test_bad_request_changes_nothing(fitted, request_, message):
    strategy, data = fitted
    before = snapshot(strategy)
    with pytest.raises(ValueError, match=message):
        strategy.forget(request_, data)
    assert_unchanged(strategy, before)


def test_empty_and_duplicate_requests_are_rejected_at_construction():
    with pytest.raises(ValueError, match="empty ForgetRequest"):
        ForgetRequest.samples([])
    with pytest.raises(ValueError, match="more than once"):
        ForgetRequest.samples([1, 2, 1])
    with pytest.raises(ValueError, match="non-negative int"):
        ForgetRequest.of_class(-1)


def test_missing_forget_data_changes_nothing(fitted):
    strategy, data = fitted
    before = snapshot(strategy)
    with pytest.raises(ValueError, match="needs the samples to forget"):
        strategy.forget(ForgetRequest.samples([4]))
    with pytest.raises(ValueError, match="forget data lacks 1 requested sample ids"):
        strategy.forget(ForgetRequest.samples([4]), toy_dataset(10, id_offset=500))
    assert_unchanged(strategy, before)


def test_mislabeled_and_misshaped_forget_data_change_nothing(fitted):
    strategy, data = fitted
    before = snapshot(strategy)
    x, y = data.dataset.tensors
    relabeled = type(data)(torch.utils.data.TensorDataset(x, (y + 1) % 4))
    with pytest.raises(ValueError, match="labels differ"):
        strategy.forget(ForgetRequest.samples([4]), relabeled)
    wrong_shape = type(data)(torch.utils.data.TensorDataset(torch.randn(120, 7), y))
    with pytest.raises(ValueError, match=r"inputs differ from the inputs learned under sample ids \[4\]"):
        strategy.forget(ForgetRequest.samples([4]), wrong_shape)
    other_inputs = type(data)(torch.utils.data.TensorDataset(x + 1e-3, y))  # same ids and labels, other inputs
    with pytest.raises(ValueError, match="inputs differ"):
        strategy.forget(ForgetRequest.samples([4]), other_inputs)
    assert_unchanged(strategy, before)


def test_request_before_any_fit():
    strategy = ACUUnlearner(analytic_model(), AnalyticRecorder())
    with pytest.raises(ValueError, match="no recorded statistics"):
        strategy.forget(ForgetRequest.of_class(0), toy_dataset(10))


def test_relearning_a_sample_is_rejected_and_statistics_kept():
    data = toy_dataset(40)
    model, rec = fit_analytic([data])
    R = rec.R.clone()
    from helpers import quiet_trainer

    with pytest.raises(ValueError, match="already learned"):
        quiet_trainer([rec]).fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    assert torch.equal(rec.R, R) and len(rec.catalog) == 40


def test_batches_without_ids_are_rejected():
    model, rec = analytic_model(), AnalyticRecorder()
    from helpers import quiet_trainer

    plain = torch.utils.data.TensorDataset(*toy_dataset(16).dataset.tensors)
    with pytest.raises(ValueError, match="batch carries no sample ids"):
        quiet_trainer([rec]).fit(model, torch.utils.data.DataLoader(plain, batch_size=8))
    assert len(rec.catalog) == 0


@pytest.mark.parametrize("ids", [[2.9], ["12"], "12", [True], torch.tensor([2.9]), np.array([1.0, 2.0])])
def test_sample_ids_must_be_integers_never_truncated(ids):
    with pytest.raises(ValueError, match="sample ids must be integers"):
        ForgetRequest.samples(ids)


def test_integer_tensors_and_arrays_are_sample_ids():
    assert ForgetRequest.samples(torch.tensor([3, 1])).sample_ids == (3, 1)
    assert ForgetRequest.samples(np.array([[4], [5]], dtype=np.int32)).sample_ids == (4, 5)
    assert ForgetRequest.samples(range(2)).sample_ids == (0, 1)


def test_data_given_to_a_method_that_reads_none_is_refused(fitted):
    from lightning_unlearn.unlearners.baselines import FinetuneUnlearner

    strategy, data = fitted
    finetune = FinetuneUnlearner(strategy.module, strategy.recorder, data, epochs=1)
    before = snapshot(finetune)
    for wrong in (data, "data.pt", np.zeros(3)):
        with pytest.raises(ValueError, match="does not read forget"):
            finetune.forget(ForgetRequest.samples([4]), wrong)
    with pytest.raises(ValueError, match="must be a torch Dataset or DataLoader"):
        strategy.forget(ForgetRequest.samples([4]), "data.pt")
    assert_unchanged(finetune, before)
