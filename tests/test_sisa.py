"""[SISA] shards x slices on a stream (``SISABackbone``), exact requests (``SISAUnlearner``, method ``sisa``), queued
requests and deadlines, [CLPU] temporary experiences.

Tolerances: every comparison is bitwise (``torch.equal``). A retrain replays the same float32 operations as a fresh
training on the retained slices (same start state, rows in the same order, seeds, kernels and one thread count, on
the CPU), so any difference is a bug, not rounding.
"""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset, Ledger
from lightning_unlearn.avalanche import fit_stream
from lightning_unlearn.callbacks.sisa import SISABackbone
from lightning_unlearn.contract import BatchKeys
from lightning_unlearn.functional import sisa
from lightning_unlearn.unlearners.sisa import SISAUnlearner

N = 240


class DictDigits(Dataset):
    """The digits as dict items ``{"image", "label", "idx"}`` (a user's own dataset)."""

    def __init__(self) -> None:
        x, y = load_digits(return_X_y=True)
        self.x = torch.tensor(x[:N] / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
        self.y = torch.tensor(y[:N], dtype=torch.long)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.x[i], "label": self.y[i], "idx": i}


KEYS = BatchKeys(input="image", target="label", sample_id="idx")


class UserCNN(L.LightningModule):
    """A user's CNN with BatchNorm, reading dict batches (or tuples), its own loss and optimizer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 10)
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = (batch["image"], batch["label"]) if isinstance(batch, dict) else batch[:2]
        return nn.functional.cross_entropy(self(x), y, label_smoothing=0.1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def digits() -> DictDigits:
    return DictDigits()


def experiences(data: DictDigits, count: int = 3) -> list[Subset]:
    """Class-incremental: digits 0-3, 4-6, 7-9."""
    groups = [(0, 4), (4, 7), (7, 10)][:count]
    return [Subset(data, [i for i in range(N) if lo <= int(data.y[i]) < hi]) for lo, hi in groups]


def backbone(**kwargs: Any) -> SISABackbone:
    options = dict(num_classes=10, shards=2, slices_per_experience=2, epochs=1, batch_size=32, batch_keys=KEYS)
    return SISABackbone(UserCNN(), **{**options, **kwargs})


def learned(temporary: int | None = None, skip: int | None = None, **kwargs: Any) -> SISABackbone:
    b, data = backbone(**kwargs), digits()
    for k, e in enumerate(experiences(data)):
        if k != skip:
            b.learn(e, experience=k, temporary=k == temporary)
    return b


def assignment(b: SISABackbone, experience: int, without: torch.Tensor) -> list[list[torch.Tensor]]:
    """The slices ``b`` gave ``experience``, per shard, without the ids ``without``."""
    stages = [st for st in b.sisa.stages if st.experience == experience]
    return [[st.ids[s][~torch.isin(st.ids[s], without)] for st in stages] for s in range(b.shards)]


def same(a: SISABackbone, b: SISABackbone) -> bool:
    """The ensembles and every stored state bitwise equal."""
    ea, eb = a.ensemble.state_dict(), b.ensemble.state_dict()
    if set(ea) != set(eb) or not all(torch.equal(ea[k], eb[k]) for k in ea):
        return False
    pairs = [(x, y) for sa, sb in zip(a.sisa.states, b.sisa.states) for x, y in zip(sa, sb)]
    counts = [len(s) for s in a.sisa.states] == [len(s) for s in b.sisa.states]
    return counts and all(torch.equal(x[k], y[k]) for x, y in pairs for k in x)


def test_assign_is_a_partition_and_class_partition_follows_the_class() -> None:
    ids, labels = torch.arange(100, 160), torch.arange(60) % 6
    parts = sisa.assign(ids, labels, shards=3, slices=2, seed=0, experience=1)
    flat = torch.cat([sl for p in parts for sl in p])
    assert torch.equal(flat.sort().values, ids) and [len(p) for p in parts] == [2, 2, 2]
    by_class = sisa.assign(ids, labels, shards=3, slices=2, seed=0, experience=1, partition="class")
    for s, p in enumerate(by_class):
        rows = torch.cat(p) - 100
        assert bool((labels[rows] % 3 == s).all())
    assert sisa.first_changed([ids[:3], ids[3:5]], [ids[:3], ids[3:4]]) == 1
    assert sisa.first_changed([ids[:3]], [ids[:3], ids[3:5]]) == 1
    with pytest.raises(ValueError, match="partition"):
        sisa.assign(ids, labels, 2, 1, 0, 0, partition="label")  # type: ignore[arg-type]


def test_sample_request_equals_training_from_scratch_on_the_retained_slices() -> None:
    b = learned()
    gone = torch.tensor([5, 130])
    plan = [assignment(b, k, gone) for k in range(3)]
    result = SISAUnlearner(b).forget(ForgetRequest.samples(gone.tolist()))
    assert result.certificate.exact and result.extra["samples_trained"] > 0
    reference, data = backbone(), digits()
    for k, e in enumerate(experiences(data)):
        kept = [i for i in e.indices if i not in gone.tolist()]
        reference.learn(Subset(data, kept), experience=k, slices=plan[k])
    assert same(b, reference)
    assert not bool(b.saw(gone).any())


def test_only_the_shards_that_held_the_ids_retrain_from_their_first_slice_with_one() -> None:
    b = learned()
    target = int(b.sisa.stages[3].ids[1][0])  # shard 1, stage 4 (experience 1's second slice)
    before = [list(s) for s in b.sisa.states]
    SISAUnlearner(b).forget(ForgetRequest.samples([target]))
    after = b.sisa.states
    assert all(x is y for x, y in zip(before[0], after[0]))  # shard 0 untouched: the same stored tensors
    assert all(x is y for x, y in zip(before[1][:4], after[1][:4]))  # shard 1: stages 1-3 and the initial kept
    assert not any(x is y for x, y in zip(before[1][4:], after[1][4:]))  # stages 4-6 retrained
    assert all(float(t.abs().sum()) == 0 for state in before[1][4:] for t in state.values() if t.is_floating_point())


def test_queued_requests_run_together_and_equal_one_by_one() -> None:
    ids = [[3], [100, 101], [200]]
    batched, ledger = learned(), Ledger()
    unlearner = SISAUnlearner(batched, ledger)
    queued = [unlearner.submit(ForgetRequest.samples(i)) for i in ids]
    assert [q.status for q in queued] == ["queued"] * 3 and bool(batched.saw(torch.tensor([3])).all())
    result = unlearner.flush()
    assert [q.status for q in queued] == ["executed"] * 3 and all(q.result is result for q in queued)
    assert len(ledger) == 1 and [e["asked"] for e in json.loads(ledger[0].extra["batch"])] == [q.asked for q in queued]
    single = learned()
    one_by_one = SISAUnlearner(single)
    for i in ids:
        one_by_one.forget(ForgetRequest.samples(i))
    assert same(batched, single)


def test_deadlines_and_the_experience_boundary_execute_the_queue() -> None:
    now = [0.0]
    b = learned(skip=2)
    unlearner = SISAUnlearner(b, deadline_requests=2, deadline_seconds=10.0, clock=lambda: now[0])
    first = unlearner.submit(ForgetRequest.samples([1]))
    assert first.status == "queued" and unlearner.poll() is None
    second = unlearner.submit(ForgetRequest.samples([2]))  # two queued: the request deadline
    assert first.status == second.status == "executed" and not unlearner.queued
    late = unlearner.submit(ForgetRequest.samples([3]))
    now[0] = 10.0
    assert unlearner.poll() is not None and late.status == "executed"  # the seconds deadline
    boundary = unlearner.submit(ForgetRequest.samples([4]))
    data = digits()
    b.learn(experiences(data)[2], experience=2)  # the boundary runs it before learning experience 2
    assert boundary.status == "executed" and len(unlearner.ledger) == 3
    assert not bool(b.saw(torch.tensor([1, 2, 3, 4])).any())


def test_a_temporary_experience_forgotten_is_one_never_learned() -> None:
    b = learned(temporary=1)  # experience 2 (permanent) is learned below it
    assert b.sisa.temporary == (1,) and b.sisa.stages[-1].experience == 1
    result = SISAUnlearner(b).forget(ForgetRequest.of_experience(1))
    assert result.extra["samples_trained"] == 0 and result.extra["experiences_dropped"] == [1]
    assert "temporary" in result.certificate.statement
    assert same(b, learned(skip=1))


def test_keep_makes_a_temporary_experience_permanent() -> None:
    b = learned(temporary=2)
    change = b.keep(2)
    assert change.samples == 0 and b.sisa.temporary == ()
    assert same(b, learned())
    with pytest.raises(ValueError, match="not temporary"):
        b.keep(2)


def test_bad_input_changes_nothing() -> None:
    b, ledger = learned(), Ledger()
    unlearner = SISAUnlearner(b, ledger)
    unlearner.forget(ForgetRequest.samples([0]))
    unlearner.submit(ForgetRequest.samples([1]))
    weights = {k: v.clone() for k, v in b.ensemble.state_dict().items()}
    state, forgotten = b.sisa, b.catalog.forgotten.clone()
    bad = [
        (lambda: unlearner.forget(ForgetRequest.samples([10_000])), "unknown"),
        (lambda: unlearner.forget(ForgetRequest.samples([0])), "forgotten"),
        (lambda: unlearner.forget(ForgetRequest.samples([1])), "queued"),
        (lambda: unlearner.submit(ForgetRequest.samples([1, 2])), "queued"),
        (lambda: unlearner.forget(ForgetRequest.of_class(3), data=Subset(digits(), [5])), "lacks"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=message):
            call()
        assert b.sisa is state and torch.equal(b.catalog.forgotten, forgotten) and len(ledger) == 1
        assert all(torch.equal(v, weights[k]) for k, v in b.ensemble.state_dict().items())
        assert [q.status for q in unlearner.queued] == ["queued"]
    unlearner.flush()
    with pytest.raises(ValueError, match="no request is queued"):
        unlearner.flush()
    state, catalog = b.sisa, len(b.catalog)
    with pytest.raises(ValueError, match="already learned"):
        b.learn(Subset(digits(), [0]), experience=5)
    assert b.sisa is state and len(b.catalog) == catalog
    partial = learned(skip=2)
    state, catalog = partial.sisa, len(partial.catalog)
    with pytest.raises(ValueError, match="learned already"):
        partial.learn(experiences(digits())[2], experience=0)
    assert partial.sisa is state and len(partial.catalog) == catalog


def test_a_class_request_under_the_class_partition_retrains_one_shard() -> None:
    b = learned(partition="class", shards=3)
    before = [list(s) for s in b.sisa.states]
    result = SISAUnlearner(b).forget(ForgetRequest.of_class(4))  # class 4: shard 1
    assert result.extra["shards_retrained"] == 1
    assert all(x is y for s in (0, 2) for x, y in zip(before[s], b.sisa.states[s]))
    assert not bool(b.ensemble.seen[:, 4].any()) and bool(b.ensemble.seen[1, 7])
    x = digits().x[:8]
    assert bool(torch.isinf(b.ensemble.eval()(x)[:, 4]).all())  # a class no shard holds is never predicted


def test_state_dict_round_trip_then_forget_with_data() -> None:
    b = learned()
    saved = b.state_dict()
    restored = backbone()
    restored.load_state_dict(saved)
    assert same(b, restored) and len(restored.catalog) == N
    with pytest.raises(ValueError, match="lacks"):
        SISAUnlearner(restored).forget(ForgetRequest.samples([7]))  # no data held after a restore
    assert same(b, restored)
    SISAUnlearner(restored).forget(ForgetRequest.samples([7]), data=digits())
    SISAUnlearner(b).forget(ForgetRequest.samples([7]))
    assert same(b, restored)
    with pytest.raises(ValueError, match="differ"):
        backbone(shards=3).load_state_dict(saved)


def test_fit_stream_drives_the_backbone_and_runs_its_requests() -> None:
    dicts = digits()
    data = IndexedDataset(TensorDataset(dicts.x, dicts.y))  # fit_stream's experiences yield (x, y, sample_id)
    stream = [Subset(data, e.indices) for e in experiences(dicts)]
    b = backbone(slices_per_experience=1, batch_keys=None)
    requests = {1: [ForgetRequest.samples([2, 150])]}
    results = fit_stream(
        b.ensemble, stream, callbacks=[b], batch_size=64, unlearning=SISAUnlearner(b), requests=requests,
        trainer_kwargs={"max_epochs": 1},
    )  # fmt: skip
    assert len(results) == 1 and results[0].certificate.exact
    direct = backbone(slices_per_experience=1, batch_keys=None)
    direct_unlearner = SISAUnlearner(direct)
    for k, e in enumerate(stream):
        direct.learn(e, experience=k)
        for request in requests.get(k, []):
            direct_unlearner.forget(request)
    assert same(b, direct) and not bool(b.saw(torch.tensor([2, 150])).any())


def test_an_avalanche_stream_is_learned_experience_by_experience() -> None:
    from lightning_unlearn.avalanche import benchmark_with_sample_ids, items_with_ids

    d = digits()
    bench = benchmark_with_sample_ids(TensorDataset(d.x, d.y), TensorDataset(d.x[:50], d.y[:50]), 3)
    b = backbone(batch_keys=None, slices_per_experience=1)
    for experience in bench.train_stream:
        b.learn(items_with_ids(experience.dataset), experience=experience.current_experience)
    learned = sum(len(e.dataset) for e in bench.train_stream)  # 3 experiences of consecutive classes
    assert [st.experience for st in b.sisa.stages] == [0, 1, 2] and len(b.catalog) == learned
    first = min(bench.train_stream[0].classes_in_this_experience)
    result = SISAUnlearner(b).forget(ForgetRequest.of_class(first))
    assert result.certificate.exact and not bool(b.ensemble.seen[:, first].any())


def headed(**kwargs: Any) -> SISABackbone:
    """A backbone publishing the ridge head over its shards' ``net`` outputs."""
    return learned(aggregate="head", trunk="net", **kwargs)


def head_tolerance(b: SISABackbone) -> float:
    """Relative tolerance between two heads solved from features that differ by float64 rounding (the batches the
    features were computed in differ): ``64 p eps kappa``, ``kappa <= (tr F^T F + gamma) / gamma`` bounding the
    condition number of ``F^T F + gamma I`` (as :func:`~lightning_unlearn.functional.acu.consistency_errors`)."""
    F = torch.cat(b.sisa.features, dim=1)
    kappa = (float((F * F).sum()) + b.ridge) / b.ridge
    return 64 * F.shape[1] * torch.finfo(torch.float64).eps * kappa


def test_the_head_after_a_request_equals_the_head_of_a_from_scratch_run() -> None:
    b = headed()
    gone = torch.tensor([5, 130])
    plan = [assignment(b, k, gone) for k in range(3)]
    result = SISAUnlearner(b).forget(ForgetRequest.samples(gone.tolist()))
    assert "ridge head" in result.certificate.statement
    assert 0 < result.extra["feature_rows_computed"] < b.shards * (N - 2)  # an untouched shard's rows were kept
    reference, data = backbone(aggregate="head", trunk="net"), digits()
    for k, e in enumerate(experiences(data)):
        reference.learn(Subset(data, [i for i in e.indices if i not in gone.tolist()]), experience=k, slices=plan[k])
    W, expected = b.ensemble.head, reference.ensemble.head
    assert W.dtype == torch.float64 and W.shape == (b.shards * 10, 10)
    assert float((W - expected).norm() / expected.norm()) <= head_tolerance(reference)
    x = data.x[:16]
    assert torch.equal(b.ensemble.eval()(x).argmax(1), reference.ensemble.eval()(x).argmax(1))
    assert not bool(torch.isin(gone, b.sisa.feature_ids).any())


def test_a_class_request_under_the_class_partition_touches_one_shard_and_its_head_equals_from_scratch() -> None:
    b = headed(partition="class", shards=3)
    before, cache = [list(s) for s in b.sisa.states], list(b.sisa.features)
    data = digits()
    fours = (data.y == 4).nonzero().flatten()
    plan = [assignment(b, k, fours) for k in range(3)]
    result = SISAUnlearner(b).forget(ForgetRequest.of_class(4))  # class 4: shard 1
    kept = N - len(fours)
    assert result.extra["shards_retrained"] == 1 and result.extra["feature_rows_computed"] == kept
    assert all(x is y for s in (0, 2) for x, y in zip(before[s], b.sisa.states[s]))
    assert all(float(f.abs().sum()) == 0 for f in cache)  # the replaced cache, forgotten rows included, is zeroed
    reference = backbone(aggregate="head", trunk="net", partition="class", shards=3)
    for k, e in enumerate(experiences(data)):
        reference.learn(Subset(data, [i for i in e.indices if int(data.y[i]) != 4]), experience=k, slices=plan[k])
    expected = reference.ensemble.head
    assert float((b.ensemble.head - expected).norm() / expected.norm()) <= head_tolerance(reference)
    assert bool(torch.isinf(b.ensemble.eval()(data.x[:8])[:, 4]).all())


def test_the_head_refuses_bad_settings_and_a_bad_request_changes_nothing() -> None:
    for kwargs, message in [
        ({"aggregate": "vote"}, "aggregate"),
        ({"aggregate": "head", "trunk": "body"}, "no submodule 'body'"),
        ({"trunk": "net"}, "trunk= only with 'head'"),
        ({"aggregate": "head", "ridge": 0.0}, "ridge > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            backbone(**kwargs)
    b, ledger = headed(), Ledger()
    unlearner = SISAUnlearner(b, ledger)
    weights = {k: v.clone() for k, v in b.ensemble.state_dict().items()}
    state, cache, forgotten = b.sisa, [f.clone() for f in b.sisa.features], b.catalog.forgotten.clone()
    with pytest.raises(ValueError, match="lacks"):
        unlearner.forget(ForgetRequest.samples([7]), data=Subset(digits(), list(range(100))))
    assert b.sisa is state and len(ledger) == 0 and torch.equal(b.catalog.forgotten, forgotten)
    assert all(torch.equal(v, weights[k]) for k, v in b.ensemble.state_dict().items())
    assert all(torch.equal(f, g) for f, g in zip(b.sisa.features, cache))
    restored, saved = backbone(aggregate="head", trunk="net"), b.state_dict()
    del saved["sisa"]["feature_dtype"]  # a state saved before the setting existed: float64 features
    restored.load_state_dict(saved)
    assert torch.equal(restored.ensemble.head, b.ensemble.head) and restored.sisa.features == ()
    with pytest.raises(ValueError, match="feature_dtype"):
        backbone(aggregate="head", trunk="net", feature_dtype=torch.float32).load_state_dict(b.state_dict())
    with pytest.raises(ValueError, match="differ"):
        backbone().load_state_dict(b.state_dict())


def test_a_float32_feature_head_after_a_request_equals_the_from_scratch_head_to_float32_rounding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("lightning_unlearn.callbacks.sisa._FEATURE_CHUNK", 64)  # several chunks; a request shifts them
    b, data = headed(feature_dtype=torch.float32), digits()
    gone = torch.tensor([5, 130])
    plan = [assignment(b, k, gone) for k in range(3)]
    result = SISAUnlearner(b).forget(ForgetRequest.samples(gone.tolist()))
    assert "float32" in result.certificate.statement
    assert 0 < result.extra["feature_rows_computed"] < b.shards * (N - 2)  # an untouched shard's rows were kept
    reference = backbone(aggregate="head", trunk="net", feature_dtype=torch.float32)
    for k, e in enumerate(experiences(data)):
        reference.learn(Subset(data, [i for i in e.indices if i not in gone.tolist()]), experience=k, slices=plan[k])
    F, kept = torch.cat(reference.sisa.features, dim=1), torch.cat(b.sisa.features, dim=1)
    assert torch.equal(F, F.float().double())  # computed in float32
    # A float32 trunk feature sums at most K = 9 + 144 products (the conv's 1x3x3 window, the linear's 4x36 inputs):
    # two batchings of it differ by at most delta = K eps_32 relative. To first order the ridge head moves by at most
    # 3 kappa delta relative, kappa the condition number of F^T F + gamma I (computed here, 2-norm).
    delta = (9 + 144) * torch.finfo(torch.float32).eps
    assert float((kept - F).norm() / F.norm()) <= delta
    eigenvalues = torch.linalg.eigvalsh(F.T @ F + reference.ridge * torch.eye(F.shape[1], dtype=F.dtype))
    kappa = float(eigenvalues[-1] / eigenvalues[0])
    W, expected = b.ensemble.head, reference.ensemble.head
    assert float((W - expected).norm() / expected.norm()) <= 3 * kappa * delta
    x = data.x[:16]
    assert torch.equal(b.ensemble.eval()(x).argmax(1), reference.ensemble.eval()(x).argmax(1))


def test_the_head_refuses_a_feature_dtype_other_than_float32_or_float64() -> None:
    with pytest.raises(ValueError, match="feature_dtype"):
        backbone(aggregate="head", trunk="net", feature_dtype=torch.float16)
