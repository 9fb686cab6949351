"""Avalanche integration: every recorder as a plugin in Avalanche's own strategies, against the same run
through Lightning (``fit_stream``); requests reported to Avalanche's loggers and to Lightning's.

Avalanche and Lightning agree where the method is deterministic: each experience is learned by
full-batch gradient descent (one batch per epoch, so the two frameworks' shuffles do not matter)
in float64; the only difference is the order of the summands inside a batch, so results agree to
far below the 1e-9 used here (float64 eps 2.2e-16 times sums of a few hundred O(1) terms).
"""

from __future__ import annotations

import csv
import logging
import warnings

import lightning as L
import pytest
import torch
from helpers import analytic_model, toy_tensors
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from lightning_unlearn import (
    ACUUnlearner,
    AnalyticRecorder,
    CCLGradientUnlearner,
    CCLHessianRecorder,
    CCLHessianUnlearner,
    CCLRecorder,
    ForgetRequest,
    HFUnlearner,
    ProximalClassifier,
    ProximalRegularizer,
    ReleaseConfig,
    SAFERecorder,
    SAFEUnlearner,
    SupervisedClassifier,
    TrajectoryRecorder,
)
from lightning_unlearn.callbacks.samples import SampleRecorder
from lightning_unlearn.functional import autodiff
from lightning_unlearn.unlearners.baselines import NegGradUnlearner

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*QP solver.*")
    from avalanche.benchmarks import class_incremental_benchmark
    from avalanche.core import SupervisedPlugin
    from avalanche.logging import BaseLogger
    from avalanche.training import DER, EWC, Naive, Replay
    from avalanche.training.plugins import EvaluationPlugin

from lightning_unlearn.avalanche import (
    UnlearningPlugin,
    benchmark_with_sample_ids,
    fit_stream,
    sample_ids,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Call to deprecated function update:DeprecationWarning"
)  # Avalanche's Replay

D, C, N = 6, 4, 48
ATOL = 1e-9
FULL_BATCH = 1000
QUIET = {"enable_progress_bar": False}


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % C
    return torch.randn(n, D, generator=g, dtype=torch.float64) + 2 * F.one_hot(y, D).double(), y


@pytest.fixture(scope="module")
def bm():
    (x, y), (xt, yt) = blobs(N, 0), blobs(16, 1)
    return benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), 2, class_order=[0, 1, 2, 3])


def exp_ids(bm, k: int) -> list[int]:
    return sorted(sample_ids(bm.train_stream[k].dataset).tolist())


def supervised(l2: float = 0.1) -> SupervisedClassifier:
    torch.manual_seed(0)
    return SupervisedClassifier(nn.Linear(D, C).double(), lr=0.2, l2=l2)


def proximal() -> ProximalClassifier:
    torch.manual_seed(0)
    return ProximalClassifier(nn.Linear(D, C).double(), lr=0.2, l2=0.1, reg_lambda=1.0)


def objective(model: SupervisedClassifier):
    """The module's own training objective as an Avalanche criterion (outputs, targets) -> loss: cross-entropy,
    plus [CCL]'s regulariser (with the ridge) of a ProximalClassifier; a SupervisedClassifier's ridge is weight
    decay."""
    regularizer = getattr(model, "regularizer", None)
    return lambda out, y: F.cross_entropy(out, y) + (regularizer.penalty(model) if regularizer is not None else 0.0)


def optimizer(model: SupervisedClassifier, **kwargs) -> torch.optim.SGD:
    """The module's own optimizer recipe (SGD; weight decay = l2 unless the regulariser carries the ridge)."""
    decay = 0.0 if hasattr(model, "regularizer") else model.l2
    return torch.optim.SGD(model.parameters(), lr=model.lr, weight_decay=decay, **kwargs)


def avalanche_run(bm, model, plugins, epochs: int, template=Naive, **kwargs):
    strategy = template(
        model=model,
        optimizer=optimizer(model),
        criterion=kwargs.pop("criterion", objective(model)),
        train_mb_size=kwargs.pop("train_mb_size", FULL_BATCH),
        train_epochs=epochs,
        plugins=plugins if isinstance(plugins, list) else [plugins],
        evaluator=kwargs.pop("evaluator", None),
        **kwargs,
    )
    for experience in bm.train_stream:
        strategy.train(experience)
    return strategy


def lightning_run(bm, model, recorder, strategy, schedule, epochs: int):
    return fit_stream(
        model,
        bm.train_stream,
        callbacks=[recorder],
        unlearning=strategy,
        requests=schedule,
        batch_size=FULL_BATCH,
        trainer_kwargs={"max_epochs": epochs, **QUIET},
    )


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.allclose(a, b, rtol=0, atol=ATOL), float((a - b).abs().max())


class Said(logging.Handler):
    """Keeps the messages of the records it is given (Lightning's own log lines)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class RecordingLogger(BaseLogger):
    """An Avalanche logger that keeps every (name, value, x) it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[tuple[str, object, int]] = []

    def log_single_metric(self, name, value, x_plot) -> None:
        self.received.append((name, value, x_plot))


# -- every recorder: Avalanche Naive + plugin against Lightning ------------------------------------
def test_analytic_recorder_plugin_gives_the_lightning_head_and_requests(bm):
    x, y = toy_tensors(400)
    xt, yt = toy_tensors(100, seed=9)
    toy = benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), 4, seed=0)
    first_class = int(next(iter(toy.train_stream[0].classes_in_this_experience)))
    others = torch.nonzero(y != first_class).flatten()[:2]
    schedule = {1: [ForgetRequest.of_class(first_class)], 3: [ForgetRequest.samples(others)]}

    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    results = fit_stream(
        model,
        toy.train_stream,
        callbacks=[rec],
        unlearning=ACUUnlearner(model, rec),
        requests=schedule,
        trainer_kwargs=QUIET,
    )
    assert [r.request for r in results] == [schedule[1][0], schedule[3][0]]
    assert len(rec.catalog) == 400 and rec.catalog.experiences.unique().tolist() == [0, 1, 2, 3]
    assert torch.equal(results[0].removed_ids.sort().values, torch.nonzero(y == first_class).flatten())

    model2, rec2 = analytic_model(), AnalyticRecorder(ridge=0.5)
    plugin = UnlearningPlugin(rec2, ACUUnlearner(model2, rec2), schedule)
    naive = Naive(
        model=model2,
        optimizer=torch.optim.SGD(model2.head.parameters(), lr=0.0),
        criterion=nn.CrossEntropyLoss(),
        train_mb_size=32,
        train_epochs=2,
        plugins=[plugin],
        evaluator=None,
    )
    for experience in toy.train_stream:
        naive.train(experience)
    assert len(plugin.results) == 2
    assert torch.allclose(rec2.W, rec.W, rtol=0, atol=1e-10)  # float64 ridge solutions of the same sums


def test_trajectory_recorder_runs_its_recursion_in_before_update(bm):
    schedule = {1: [ForgetRequest.samples(exp_ids(bm, 0)[:2] + exp_ids(bm, 1)[:1])]}
    m1, r1 = supervised(), TrajectoryRecorder(dtype=torch.float64)
    lightning_run(
        bm, m1, r1, HFUnlearner(m1, r1, max_deletions=10, release=ReleaseConfig(noise=False)), schedule, epochs=3
    )
    m2, r2 = supervised(), TrajectoryRecorder(dtype=torch.float64)
    plugin = UnlearningPlugin(r2, HFUnlearner(m2, r2, max_deletions=10, release=ReleaseConfig(noise=False)), schedule)
    avalanche_run(bm, m2, plugin, epochs=3)

    assert r2.n_steps == r1.n_steps == 6 and r2.lrs == r1.lrs and r2.batch_sizes == r1.batch_sizes
    for i in exp_ids(bm, 0) + exp_ids(bm, 1):
        assert_close(r2.A[r2.row_of[i]], r1.A[r1.row_of[i]])
    assert plugin.results[0].removed_ids.numel() == 3
    assert_close(autodiff.flat_params(m2), autodiff.flat_params(m1))


def test_trajectory_recorder_refuses_a_momentum_optimizer_under_the_plugin(bm):
    model, rec = supervised(), TrajectoryRecorder(dtype=torch.float64)
    naive = Naive(
        model=model,
        optimizer=optimizer(model, momentum=0.9),
        criterion=objective(model),
        train_mb_size=FULL_BATCH,
        plugins=[UnlearningPlugin(rec)],
        evaluator=None,
    )
    with pytest.raises(ValueError, match="momentum"):
        naive.train(bm.train_stream[0])


def test_gradient_strategy_without_constants_fails_at_plugin_construction(bm):
    model, rec = proximal(), CCLRecorder()
    schedule = {1: [ForgetRequest.of_experience(0)]}
    with pytest.raises(ValueError, match="lipschitz"):
        UnlearningPlugin(rec, CCLGradientUnlearner(model, rec), schedule)
    with pytest.raises(ValueError, match="lipschitz"):  # and before any training in fit_stream
        fit_stream(
            model,
            bm.train_stream,
            callbacks=[rec],
            unlearning=CCLGradientUnlearner(model, rec),
            requests=schedule,
        )
    assert len(rec.catalog) == 0


def test_task_delta_recorder_anchors_each_task_under_the_plugin(bm):
    schedule = {1: [ForgetRequest.of_experience(0)]}

    def strategy(model, rec):
        return CCLGradientUnlearner(model, rec, lipschitz=2.0, smoothness=1.0, release=ReleaseConfig(seed=5))

    m1, r1 = proximal(), CCLRecorder()
    lightning_log = logging.getLogger("lightning.pytorch")
    lightning_log.addHandler(said := Said())
    try:
        lightning_run(bm, m1, r1, strategy(m1, r1), schedule, epochs=4)
    finally:
        lightning_log.removeHandler(said)
    # the one Trainer of the stream keeps the module's regulariser: nothing replaced, nothing said about it
    assert not [m for m in said.messages if "configure_callbacks" in m], said.messages
    m2, r2 = proximal(), CCLRecorder()
    avalanche_run(bm, m2, UnlearningPlugin(r2, strategy(m2, r2), schedule), epochs=4)

    assert r2.experience_ids == [0, 1] and r2.sizes == r1.sizes == [N // 2, N // 2]
    assert torch.count_nonzero(r2.starts[0]) == 0  # w_0 = 0 anchors the first task
    assert_close(r2.starts[1], r2.ends[0])  # start_task anchored task 1 at task 0's solution
    for a, b in zip(r2.starts + r2.ends, r1.starts + r1.ends):
        assert_close(a, b)
    assert_close(autodiff.flat_params(m2), autodiff.flat_params(m1))  # same internal model, same seeded noise


def test_hessian_recorder_and_restored_internal_model_under_the_plugin(bm):
    schedule = {0: [ForgetRequest.samples(exp_ids(bm, 0)[:3])], 1: [ForgetRequest.samples(exp_ids(bm, 1)[:2])]}

    def strategy(model, rec):
        return CCLHessianUnlearner(model, rec, release=ReleaseConfig(seed=3))

    m1, r1 = proximal(), CCLHessianRecorder(hessian="exact")
    m2, r2 = proximal(), CCLHessianRecorder(hessian="exact")
    s2 = strategy(m2, r2)
    plugin, before, capture = UnlearningPlugin(r2, s2, schedule), Capture(s2), Capture(s2)
    with pytest.warns(UserWarning, match="not solved exactly"):  # four SGD epochs do not solve a task
        res1 = lightning_run(bm, m1, r1, strategy(m1, r1), schedule, epochs=4)
    with pytest.warns(UserWarning, match="not solved exactly"):
        avalanche_run(bm, m2, [before, plugin, capture], epochs=4)

    published, internal = capture.snapshots[0]
    assert plugin.results[0].extra["noise_norm"] > 0.01 and not torch.allclose(published, internal)
    assert_close(r2.starts[1], internal)  # task 1 started from the restored internal model, not the published one
    assert_close(before.starts[1], internal)  # restored in before_training: plugins listed earlier see it too
    assert not torch.allclose(internal, r2.ends[0])  # (which the Newton correction had moved)
    for a, b in zip(r2.starts + r2.ends + r2.hessians, r1.starts + r1.ends + r1.hessians):
        assert_close(a, b)
    assert [r.extra["correction_norm"] for r in plugin.results] == pytest.approx(
        [r.extra["correction_norm"] for r in res1], abs=ATOL
    )
    assert_close(autodiff.flat_params(m2), autodiff.flat_params(m1))


class Capture(SupervisedPlugin):
    """The module's weights (and the strategy's internal model) after each experience, and at the start of
    each experience as a plugin listed before the UnlearningPlugin sees them."""

    def __init__(self, unlearning) -> None:
        super().__init__()
        self.unlearning, self.snapshots, self.starts = unlearning, [], []

    def before_training_exp(self, strategy, **kwargs) -> None:
        self.starts.append(autodiff.flat_params(strategy.model).clone())

    def after_training_exp(self, strategy, **kwargs) -> None:
        internal = self.unlearning._internal  # None for a plugin listed before the UnlearningPlugin
        self.snapshots.append(
            (autodiff.flat_params(strategy.model).clone(), None if internal is None else internal.clone())
        )


def test_streaming_recorder_takes_its_anchor_pass_through_the_plugin(bm):
    schedule = {1: [ForgetRequest.samples(exp_ids(bm, 0)[:2] + exp_ids(bm, 1)[:2])]}

    def strategy(model, rec):
        return SAFEUnlearner(model, rec, step_size=0.05, forget_weight=10.0)

    m1, r1 = supervised(l2=0.0), SAFERecorder(num_classes=C, proj_dim=3)
    lightning_run(bm, m1, r1, strategy(m1, r1), schedule, epochs=3)
    m2, r2 = supervised(l2=0.0), SAFERecorder(num_classes=C, proj_dim=3)
    plugin = UnlearningPlugin(r2, strategy(m2, r2), schedule)
    avalanche_run(bm, m2, plugin, epochs=3)

    assert r2.n_anchor == r1.n_anchor == N and r2.rounds == 1
    for name in r1.grad_sum:
        assert_close(r2.grad_sum[name], r1.grad_sum[name])
        assert_close(r2.w0[name], r1.w0[name])
    assert_close(r2.counts, r1.counts)
    assert_close(autodiff.flat_params(m2), autodiff.flat_params(m1))


# -- Avalanche's own strategies with a baseline; reports reach Avalanche's loggers -----------------
class BufferBeforeRequests(SupervisedPlugin):
    """Each sample's stored DER logits as the buffer holds them after each experience, before the requests run
    (listed before the UnlearningPlugin: DER fills its buffer before the plugins' after_training_exp)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits: dict[int, torch.Tensor] = {}

    def after_training_exp(self, strategy, **kwargs) -> None:
        buffer = strategy.storage_policy.buffer
        self.logits |= {int(i): item[3] for i, item in zip(sample_ids(buffer), buffer)}


@pytest.mark.parametrize("template", [Naive, EWC, Replay, DER])
def test_sample_recorder_in_naive_ewc_replay_and_der(bm, template):
    """Avalanche's own strategies read (x, y, t) mini-batches (DER unpacks its items by position) while the plugin
    records every sample of the experience once and drops forgotten samples from the replay buffers, with their
    DER logits, also after the last experience."""
    forget = {0: exp_ids(bm, 0)[:3], 1: exp_ids(bm, 1)[:2]}
    model, rec = supervised(), SampleRecorder()
    logger = RecordingLogger()
    requests = {k: [ForgetRequest.samples(ids)] for k, ids in forget.items()}
    before = BufferBeforeRequests()
    plugins = [before] if template is DER else []
    extra = {
        EWC: {"ewc_lambda": 1.0},
        Replay: {"mem_size": 100},
        DER: {"mem_size": 100, "batch_size_mem": 8},
    }.get(template, {})
    strategy = avalanche_run(
        bm,
        model,
        [*plugins, UnlearningPlugin(rec, NegGradUnlearner(model, rec, epochs=1), requests)],
        epochs=2,
        template=template,
        criterion=nn.CrossEntropyLoss(),
        train_mb_size=8,
        evaluator=EvaluationPlugin(loggers=[logger]),
        **extra,
    )

    assert len(rec.catalog) == N  # replayed samples are not learned twice
    assert rec.catalog.experiences_of(torch.tensor(exp_ids(bm, 1))).unique().tolist() == [1]
    assert sorted(rec.catalog.ids[rec.catalog.forgotten].tolist()) == sorted(forget[0] + forget[1])
    removed = [(v, x) for name, v, x in logger.received if name == "unlearn/removed"]
    assert removed == [(3.0, 2 * 24 // 8), (2.0, 4 * 24 // 8)]  # once each, at the iteration count after its experience
    if template in (Replay, DER):  # the forgotten samples left the buffer (a batch holding one is refused)
        owner = strategy if template is DER else next(p for p in strategy.plugins if hasattr(p, "storage_policy"))
        buffer = owner.storage_policy.buffer
        kept = sample_ids(buffer).tolist()
        assert len(kept) == len(buffer) == N - 5 and not set(kept) & set(forget[0] + forget[1])
    if template is DER:  # each retained sample kept its own stored logits
        assert len(before.logits) == N and all(torch.equal(item[3], before.logits[i]) for i, item in zip(kept, buffer))


def test_a_benchmark_without_sample_ids_is_a_clear_error(bm):
    (x, y), (xt, yt) = blobs(N, 0), blobs(16, 1)
    train, test = TensorDataset(x, y), TensorDataset(xt, yt)
    train.targets, test.targets = y, yt
    plain = class_incremental_benchmark({"train": train, "test": test}, num_experiences=2, class_order=[0, 1, 2, 3])
    model, rec = supervised(), SampleRecorder()
    with pytest.raises(ValueError, match="carries no sample ids"):
        avalanche_run(plain, model, UnlearningPlugin(rec), epochs=1)
    with pytest.raises(ValueError, match="carries no sample ids"):
        fit_stream(model, plain.train_stream, callbacks=[rec])
    assert len(rec.catalog) == 0


# -- Lightning loggers ---------------------------------------------------------------------------
def test_requests_reach_the_csv_logger_on_one_increasing_step_axis(bm, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    ids0, ids1 = exp_ids(bm, 0), exp_ids(bm, 1)
    schedule = {
        0: [ForgetRequest.samples(ids0[:1]), ForgetRequest.samples(ids0[1:3])],
        1: [ForgetRequest.samples(ids1[:1])],
    }
    model, rec = supervised(), TrajectoryRecorder(dtype=torch.float64)
    logger = CSVLogger(tmp_path, name="run")
    fit_stream(
        model,
        bm.train_stream,
        callbacks=[rec],
        unlearning=HFUnlearner(model, rec, max_deletions=10, release=ReleaseConfig(noise=False)),
        requests=schedule,
        batch_size=8,
        trainer_kwargs={"max_epochs": 2, "logger": logger, "log_every_n_steps": 1, **QUIET},
    )

    with open(logger.log_dir + "/metrics.csv") as f:  # read from disk: the last request was flushed
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    train = [int(r["step"]) for r in rows if r.get("train_loss")]
    requests = [(int(r["step"]), float(r["unlearn/removed"])) for r in rows if r.get("unlearn/removed")]
    per_exp = 2 * 24 // 8
    assert train == list(range(2 * per_exp))  # one Trainer: the second experience continues the step axis
    assert requests == [(per_exp, 1.0), (per_exp, 2.0), (2 * per_exp, 1.0)]  # where training resumes
    assert steps == sorted(steps)
    assert all(r["unlearn/exact"] == "0.0" for r in rows if r.get("unlearn/removed"))


def test_mismatched_recorder_model_or_replayed_steps_are_clear_errors(bm):
    model, rec, other = supervised(), SampleRecorder(), SampleRecorder()
    unlearning = NegGradUnlearner(model, rec, epochs=1)
    with pytest.raises(ValueError, match="another recorder"):
        UnlearningPlugin(other, unlearning)
    with pytest.raises(ValueError, match="not among the callbacks"):
        fit_stream(model, bm.train_stream, callbacks=[other], unlearning=unlearning)
    with pytest.raises(ValueError, match="another model"):
        avalanche_run(bm, supervised(), UnlearningPlugin(rec, unlearning), epochs=1)
    assert len(rec.catalog) == len(other.catalog) == 0

    model, rec = supervised(), TrajectoryRecorder(dtype=torch.float64)
    with pytest.raises(ValueError, match="replaying samples of earlier experiences"):
        avalanche_run(bm, model, UnlearningPlugin(rec), epochs=1, template=Replay, mem_size=8)
    assert rec.catalog.experiences.unique().tolist() == [0]  # experience 0 was recorded, the replayed step refused


class _UserLinear(L.LightningModule):
    """A user module: its own CE training step and SGD with weight decay (no library base class)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(D, C).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.2, weight_decay=0.1)


def test_proximal_regularizer_callback_on_a_user_module_is_also_an_avalanche_plugin(bm):
    """[CCL]'s regulariser as a Lightning callback and as an Avalanche plugin (before_training_exp anchors,
    before_update adds lambda (w - anchor)): the same task chain either way, recorded by a CCLHessianRecorder."""
    m1, reg1, r1 = _UserLinear(), ProximalRegularizer(1.0), CCLHessianRecorder(hessian="exact")
    with pytest.warns(UserWarning, match="not solved exactly"):  # four SGD epochs do not solve a task
        kwargs = {"max_epochs": 4, **QUIET}
        fit_stream(m1, bm.train_stream, callbacks=[reg1, r1], batch_size=FULL_BATCH, trainer_kwargs=kwargs)
    m2, reg2, r2 = _UserLinear(), ProximalRegularizer(1.0), CCLHessianRecorder(hessian="exact")
    r2.regularizer = reg2
    r2.read_optimizer([torch.optim.SGD(m2.parameters(), lr=0.2, weight_decay=0.1)], m2)
    strategy = Naive(
        model=m2,
        optimizer=torch.optim.SGD(m2.parameters(), lr=0.2, weight_decay=0.1),
        criterion=F.cross_entropy,
        train_mb_size=FULL_BATCH,
        train_epochs=4,
        plugins=[reg2, UnlearningPlugin(r2)],
        evaluator=None,
    )
    with pytest.warns(UserWarning, match="not solved exactly"):
        for experience in bm.train_stream:
            strategy.train(experience)
    assert reg1.tasks_learned == reg2.tasks_learned == 2
    assert (r1.reg_lambda, r1.l2) == (r2.reg_lambda, r2.l2) == (1.0, 0.1)
    assert torch.count_nonzero(r2.starts[0]) == 0 and torch.equal(r2.starts[1], r2.ends[0])
    for a, b in zip(r1.starts + r1.ends + r1.hessians, r2.starts + r2.ends + r2.hessians):
        assert_close(a, b)


# -- fit_stream: loaders, data modules, validation/test, checkpoints between experiences ---------
class _EvalLinear(_UserLinear):
    """The user module with validation and test steps (accuracy), logged per dataloader."""

    def validation_step(self, batch, batch_idx: int) -> None:
        self.log("val_acc", (self(batch[0]).argmax(-1) == batch[1]).double().mean())

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.log("test_acc", (self(batch[0]).argmax(-1) == batch[1]).double().mean())


def test_fit_stream_validates_tests_checkpoints_and_resumes_where_it_stopped(bm, tmp_path):
    """Validation during each fit, tests after each experience's requests, a checkpoint after each; a stream
    resumed from experience 0's checkpoint in fresh objects ends where the uninterrupted one does (same SGD
    steps, recorded vectors, forgotten samples) and logs on the same step axis."""
    from lightning.pytorch.loggers import CSVLogger

    schedule = {0: [ForgetRequest.samples(exp_ids(bm, 0)[:2])], 1: [ForgetRequest.samples(exp_ids(bm, 1)[:1])]}

    def run(name: str, **kwargs):
        model, rec = _EvalLinear(), TrajectoryRecorder(dtype=torch.float64)
        logger = CSVLogger(tmp_path, name=name)
        fit_stream(
            model,
            bm.train_stream,
            callbacks=[rec],
            unlearning=HFUnlearner(model, rec, max_deletions=10, release=ReleaseConfig(noise=False)),
            requests=schedule,
            batch_size=FULL_BATCH,
            val_stream=bm.test_stream,
            test_stream=bm.test_stream,
            trainer_kwargs={"max_epochs": 3, "logger": logger, "log_every_n_steps": 1, **QUIET},
            **kwargs,
        )
        with open(logger.log_dir + "/metrics.csv") as f:
            return model, rec, list(csv.DictReader(f))

    m1, r1, rows1 = run("whole", dirpath=tmp_path / "ckpts")
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["experience=0.ckpt", "experience=1.ckpt"]
    val = [int(r["step"]) for r in rows1 if r.get("val_acc")]
    tested = [r for r in rows1 if r.get("test_acc/dataloader_idx_0")]
    tests = [(int(r["step"]), r["test_acc/dataloader_idx_1"] != "") for r in tested]
    assert val == [0, 1, 2, 3, 4, 5]  # one validation per epoch, at its step (full batch: one step per epoch)
    assert tests == [(3, True), (6, True)]  # after each experience, every test experience
    restored = TrajectoryRecorder(dtype=torch.float64).load_from_checkpoint(tmp_path / "ckpts" / "experience=0.ckpt")
    assert restored.catalog.forgotten.sum() == 2 and restored.n_steps == 3  # returned, after experience 0's request

    m2, r2, rows2 = run("resumed", ckpt_path=tmp_path / "ckpts" / "experience=0.ckpt")
    assert_close(autodiff.flat_params(m2), autodiff.flat_params(m1))
    forgotten = [sorted(r.catalog.ids[r.catalog.forgotten].tolist()) for r in (r1, r2)]
    assert r2.n_steps == r1.n_steps == 6 and forgotten[0] == forgotten[1] and len(forgotten[0]) == 3
    for i in exp_ids(bm, 0) + exp_ids(bm, 1):
        assert_close(r2.A[r2.row_of[i]], r1.A[r1.row_of[i]])
    assert [int(r["step"]) for r in rows2 if r.get("train_loss")] == []  # the user module logs no train_loss
    assert [int(r["step"]) for r in rows2 if r.get("val_acc")] == [3, 4, 5]  # the step axis continues


def test_fit_stream_takes_loaders_data_modules_and_a_sampler(bm):
    """Experiences as a DataLoader, a LightningDataModule and a dataset (through a sampler); requests read the
    data module's training data."""
    from torch.utils.data import DataLoader, SubsetRandomSampler

    from lightning_unlearn import IndexedDataset

    (x, y) = blobs(3 * N, 5)
    parts = [IndexedDataset(TensorDataset(x[k::3], y[k::3]), ids=torch.arange(k, 3 * N, 3)) for k in range(3)]

    class Module(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(parts[1], batch_size=8, shuffle=True)

    model, rec = supervised(), SampleRecorder()
    forget = [int(parts[1].ids[0]), int(parts[1].ids[5])]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # Lightning's LeafSpec one is dropped by fit_stream
        results = fit_stream(
            model,
            [DataLoader(parts[0], batch_size=8), Module(), parts[2]],
            callbacks=[rec],
            unlearning=NegGradUnlearner(model, rec, epochs=1),
            requests={1: [ForgetRequest.samples(forget)]},
            sampler=lambda d: SubsetRandomSampler(range(0, len(d), 2)),
            trainer_kwargs=QUIET,
        )
    assert [r.removed_ids.tolist() for r in results] == [forget]
    cat = rec.catalog
    assert cat.experiences_of(parts[0].ids).unique().tolist() == [0]
    assert cat.experiences_of(parts[1].ids).unique().tolist() == [1]
    assert sorted(cat.ids[cat.experiences == 2].tolist()) == parts[2].ids[::2].tolist()  # only what the sampler drew


def test_fit_stream_refuses_evaluation_without_steps_and_foreign_checkpoints(bm, tmp_path):
    model, rec = supervised(), SampleRecorder()
    with pytest.raises(ValueError, match="no test_step"):
        fit_stream(model, bm.train_stream, callbacks=[rec], test_stream=bm.test_stream)
    trainer = L.Trainer(logger=False, **QUIET)
    trainer.strategy.connect(model)
    trainer.save_checkpoint(tmp_path / "plain.ckpt")
    with pytest.raises(ValueError, match="not saved by fit_stream"):
        fit_stream(model, bm.train_stream, callbacks=[rec], ckpt_path=tmp_path / "plain.ckpt")
    assert len(rec.catalog) == 0
