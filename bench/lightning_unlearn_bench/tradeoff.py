"""Privacy-utility curve of the certified methods: test accuracy against the per-release epsilon.

Setting (the [HF] paper's convex experiment on this machine's data): L2-regularised logistic
regression (one linear layer, softmax) on scikit-learn's 8x8 digits (raw pixels in [0, 1], the
``train`` split, one experience), 5% of the training samples deleted one sample per request; or on a user's
data (``data=``: a LightningDataModule or a (train, test) pair, its inputs flattened as the features; a seeded
30% of its training set is held out as the ``base`` split, as digits' is). The
recipe (lr, l2) is :func:`~lightning_unlearn.privacy.recipe.propose_recipe`'s for epsilon = 1, every
constant is a closed-form bound (:func:`~lightning_unlearn.functional.bounds.linear_model_constants`),
the noise comes from the OS entropy source, and every release is accounted: the table reports,
after the last request, the test accuracy, the gap to retraining, the last release's sigma, the
accountant's total epsilon over all releases (at the same delta), and two attacks (MIA-U AUC with
DirectDiff features, offline LiRA AUC).

The attacks' audit: the members are the forgotten samples, the non-members as many samples (at most half of it) of the
held-out ``base`` split, each with its own label (no model saw them, and they come from the training data's distribution
by construction: a test split of another distribution would make a retrain look like a leak). LiRA's shadow models are
trained with the recipe of the model they attack (:func:`~lightning_unlearn.metrics.shadow_models`): for the head's rows
the head's own solve (a :class:`SoftmaxHeadRecorder` at :data:`HEAD_L2` and its tolerance), for ``hf`` and ``safe`` the
SGD recipe, for ``ccl_hessian`` and ``ccl_gradient`` the L-BFGS fit, each on :data:`LIRA_SHADOWS` random subsets, of the
target's training-set size, of the retained samples and the rest of ``base``; the noise of a release and [CR]'s loss
perturbation are not part of the shadows' recipe. Each family has a ``never_forgot[...]`` row, its model before any
request: next to the retrain (LiRA ~0.5), it shows what the attack finds in a model that still holds the forgotten
samples. MIA-U compares the models before and after the requests: the retrain leaks under it by design ([MIAU]; [HF]
Fig. 5), and ``never_forgot`` (no change) scores 0.5.

Methods: ``resolve`` (the certified softmax head re-solved to a computed distance, [derived],
``docs/certified_head.md``) and ``certified_removal`` ([CR], Newton removal with a loss perturbation drawn for each
epsilon), both at their own ``l2`` (:data:`HEAD_L2`) and against ``retrain[exact]`` (that head's optimum on the
retained samples, solved from scratch); ``hf`` ([HF], SGD recipe), ``ccl_hessian`` and ``ccl_gradient`` ([CCL]
Alg. 2 / Alg. 1, the task solved by full-batch L-BFGS to a checked tolerance), ``safe`` ([SAFE] Alg. 1's step); each
noise-free (``epsilon = inf``) and next to its retrained reference. Every certified release calibrates on
the strategies' default, the contraction bound [derived] (``docs/certificates.md``; SAFE's from the same
fit's :class:`TrajectoryRecorder`). Two SGD references: ``retrain[sgd]`` (the recipe retrained on the
retained samples with a fresh shuffle: what ``retrain_acc`` of hf and safe is) and
``retrain[sgd,same batches]`` (the recorded batches without the forgotten samples, [HF] Eqs. (4)-(5): the
retrain the certificates compare with). HF's :class:`TrajectoryRecorder` keeps the vectors of the samples the schedule
forgets only (``track=``: one Hessian-vector product per tracked sample and SGD step is the fit's cost, and the
other vectors are never read); the same-batches retrain reads each step's batch from a log of the fit's batches.
"""

from __future__ import annotations

import copy
import csv
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_unlearn.callbacks import (
    CCLHessianRecorder,
    SAFERecorder,
    SoftmaxHeadRecorder,
    TaskOptimality,
    TrajectoryRecorder,
)
from lightning_unlearn.contract import unpack_batch
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.data import IndexedDataset
from lightning_unlearn.functional import autodiff, convex, hf
from lightning_unlearn.functional.bounds import linear_model_constants, max_feature_norm, module_constants
from lightning_unlearn.metrics import accuracy, lira_auc, mia_u_auc, shadow_models
from lightning_unlearn.models import ProximalClassifier, SupervisedClassifier
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.privacy.recipe import Recipe, propose_recipe
from lightning_unlearn.progress import QUIET_TRAINER
from lightning_unlearn.unlearners import CertifiedRemovalUnlearner
from lightning_unlearn_bench.registry import unlearner

EPSILONS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0)
#: the certified head's ridge (the convex family's default) and [CR]'s residual budget (sum form)
HEAD_L2, CR_BUDGET = 1e-3, 0.1
METHODS = ("resolve", "certified_removal", "hf", "ccl_hessian", "ccl_gradient", "safe")
COLUMNS = (
    "method",
    "epsilon",
    "test_acc",
    "retrain_acc",
    "gap_pp",
    "sigma",
    "sensitivity",
    "epsilon_total",
    "releases",
    "certified",
    "mia_u_auc",
    "lira_auc",
)


def _trainer(callbacks: list[L.Callback], epochs: int, trainer_kwargs: Mapping[str, Any]) -> L.Trainer:
    return L.Trainer(max_epochs=epochs, callbacks=callbacks, **{**QUIET_TRAINER, **trainer_kwargs})


#: the share of a user's training set held out as ``base`` (digits' share): the audit's non-members and, with the
#: retained samples, the LiRA shadows' population
BASE_FRACTION = 0.3
#: LiRA shadow models per model family
LIRA_SHADOWS = 4


def _release_at(eps: float, delta: float) -> ReleaseConfig:
    """The release of one column of the table: certified at ``eps``, or the noise-free update at ``eps = inf``."""
    return ReleaseConfig(epsilon=1.0 if eps == math.inf else eps, delta=delta, noise=eps != math.inf)


def tradeoff_splits(data: Any, seed: int) -> tuple[str, dict[str, tuple[Tensor, Tensor]]]:
    """The data's name and its ``base`` (held out), ``train`` and ``test`` splits as float64 ``(x, y)`` tensors,
    ``x`` flattened: digits (``data=None``), or a user's datamodule or ``(train, test)`` pair whose training set loses
    a seeded :data:`BASE_FRACTION` to ``base`` (:func:`~lightning_unlearn_bench.own.read_data`).

    Raises:
        ValueError: see :func:`~lightning_unlearn_bench.own.read_data`.
    """
    if data == "mnist-5k":
        from lightning_unlearn_bench.datasets import MNIST5k

        name, data = data, (MNIST5k(train=True), MNIST5k(train=False))
    else:
        name = "digits" if data is None else type(data).__name__
    if data is None:
        from lightning_unlearn_bench.digits import digits_splits

        splits = digits_splits(seed=seed)
        return "digits", {k: (x.double(), y) for k, (x, y) in splits.items()}
    from lightning_unlearn_bench.own import read_data

    train, test = read_data(data)
    (x, y), (xt, yt) = train.dataset.tensors, test.tensors  # type: ignore[attr-defined]
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    base, rest = order[: round(BASE_FRACTION * len(y))], order[round(BASE_FRACTION * len(y)) :].sort().values
    x, xt = x.flatten(1).double(), xt.flatten(1).double()
    return name, {"base": (x[base], y[base]), "train": (x[rest], y[rest]), "test": (xt, yt)}


class _Setup:
    """Data, recipe, deletion set, the attacks' audit sets and the trained models every method starts from."""

    def __init__(
        self,
        *,
        epochs: int,
        batch_size: int,
        fraction: float,
        delta: float,
        seed: int,
        trainer_kwargs: Mapping[str, Any],
        data: Any = None,
    ) -> None:
        self.trainer_kwargs = dict(trainer_kwargs)
        self.name, splits = tradeoff_splits(data, seed)
        (self.xb, self.yb), (x, y), (xt, yt) = splits["base"], splits["train"], splits["test"]
        self.x, self.y, self.test = x, y, TensorDataset(xt, yt)
        self.num_classes = 1 + int(torch.cat([y, yt, self.yb]).max())
        self.train = IndexedDataset(TensorDataset(self.x, self.y))
        self.epochs, self.batch_size, self.delta, self.seed = epochs, batch_size, delta, seed
        n = len(self.y)
        self.m = max(1, round(fraction * n))
        self.forget_ids = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: self.m]
        keep = torch.ones(n, dtype=torch.bool)
        keep[self.forget_ids] = False
        self.keep = keep
        # rounded up as module_constants' (the HF rows' constants) is: a recipe at the contraction bound 2/(M + lambda)
        # of the unrounded norm exceeds the bound of theirs by rounding, and a certified release is refused
        self.feature_norm = max_feature_norm(nn.Identity(), [self.x])
        self.recipe, self.candidates = propose_recipe(
            self.feature_norm,
            self.x.shape[1],
            self.num_classes,
            n,
            epsilon=1.0,
            delta=delta,
            n_deletions=self.m,
            epochs=epochs,
            batch_size=batch_size,
        )
        self.forgotten = TensorDataset(self.x[~keep], self.y[~keep])
        # the non-members: as many samples of base as are forgotten (at most half of base); the rest of base and the
        # retained samples are the shadows' population (it holds no audited sample)
        held = torch.randperm(len(self.yb), generator=torch.Generator().manual_seed(seed + 1))
        out, rest = held.tensor_split([min(self.m, len(held) // 2)])
        self.nonmembers = TensorDataset(self.xb[out], self.yb[out])
        self.population = TensorDataset(
            *(torch.cat([b[rest], t[keep]]) for b, t in ((self.xb, self.x), (self.yb, self.y)))
        )

    def shadows(self, train: Callable[[Tensor, Tensor], nn.Module]) -> list[nn.Module]:
        """LiRA's shadow models of a family: its recipe ``train(x, y)`` on :data:`LIRA_SHADOWS` random subsets of the
        population, each of the training set's size (at most three quarters of the population, so that they differ
        when many samples are forgotten)."""
        size = min(len(self.y), 3 * len(self.population) // 4)

        def fit(data: Dataset) -> nn.Module:
            x, y = next(iter(DataLoader(data, batch_size=size)))  # the subset's rows, stacked in its order
            return train(x, y)

        return shadow_models(fit, self.population, size=size, count=LIRA_SHADOWS, seed=self.seed)

    def linear(self) -> SupervisedClassifier:
        torch.manual_seed(self.seed)
        head = nn.Linear(self.x.shape[1], self.num_classes).double()
        return SupervisedClassifier(head, lr=self.recipe.lr, l2=self.recipe.l2)

    def loader(self, x: Tensor, y: Tensor, ids: Tensor | None = None, batch_size: int | None = None) -> DataLoader:
        ds = IndexedDataset(TensorDataset(x, y), ids=ids)
        return DataLoader(
            ds,
            batch_size=batch_size or self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _sgd(self, x: Tensor, y: Tensor, seed: int) -> SupervisedClassifier:
        model = self.linear()
        torch.manual_seed(seed)
        _trainer([], self.epochs, self.trainer_kwargs).fit(model, self.loader(x, y))
        return model

    def head(self) -> _SolvedHead:
        return _SolvedHead(self.x.shape[1], self.num_classes)

    def fit_head(
        self, x: Tensor | None = None, y: Tensor | None = None, loss_perturbation: float | None = None
    ) -> tuple[_SolvedHead, SoftmaxHeadRecorder]:
        """The head solved by its recorder on ``(x, y)`` (default: the training set)."""
        x, y = (self.x, self.y) if x is None or y is None else (x, y)
        model, recorder = self.head(), SoftmaxHeadRecorder(HEAD_L2, loss_perturbation=loss_perturbation)
        _trainer([recorder], 1, self.trainer_kwargs).fit(model, self.loader(x, y, batch_size=1024))
        return model, recorder

    def proximal(self) -> ProximalClassifier:
        torch.manual_seed(self.seed)
        return ProximalClassifier(
            nn.Linear(self.x.shape[1], self.num_classes).double(),
            lr=1.0,
            l2=self.recipe.l2,
            reg_lambda=1.0,
            optimizer="lbfgs",
        )

    def fit_proximal(
        self, model: ProximalClassifier, x: Tensor, y: Tensor, callbacks: list[L.Callback], ids: Tensor | None = None
    ) -> ProximalClassifier:
        _trainer(callbacks, 2, self.trainer_kwargs).fit(model, self.loader(x, y, ids, batch_size=len(y)))
        return model


class _SolvedHead(L.LightningModule):
    """Softmax regression on the flattened inputs whose head a :class:`SoftmaxHeadRecorder` solves (no optimizer
    step changes it: the SGD optimizer has lr 0 and no gradient reaches it)."""

    def __init__(self, d: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(d, num_classes, dtype=torch.float64)
        self.automatic_optimization = False

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x.flatten(1).to(torch.float64))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.optimizers().step()  # type: ignore[union-attr]  # counts the step (checkpoint callbacks need it)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _row(
    method: str,
    epsilon: float,
    model: nn.Module,
    before: nn.Module,
    retrain_acc: float,
    setup: _Setup,
    shadows: Sequence[nn.Module],
    cert: Any = None,
) -> dict[str, Any]:
    """One row; ``before``: the model before the requests (MIA-U's), ``shadows``: LiRA's of the model's family."""
    acc = accuracy(model, setup.test, setup.num_classes)
    acct = cert.accounting if cert is not None else {}
    return {
        "method": method,
        "epsilon": epsilon,
        "test_acc": acc,
        "retrain_acc": retrain_acc,
        "gap_pp": 100 * (retrain_acc - acc),
        "sigma": cert.sigma if cert is not None and cert.sigma is not None else 0.0,
        "sensitivity": cert.bounds.get("sensitivity", math.nan) if cert is not None else 0.0,
        "epsilon_total": acct.get("epsilon_total", math.inf if epsilon == math.inf else math.nan),
        "releases": int(acct.get("releases", 0)),
        "certified": bool(cert.certified) if cert is not None else False,
        "mia_u_auc": mia_u_auc(before, model, setup.forgotten, setup.nonmembers),
        "lira_auc": lira_auc(model, shadows, setup.forgotten, setup.nonmembers),
    }


def _requests(setup: _Setup, strategy: Any, data: Any = None) -> Any:
    cert = None
    for i in setup.forget_ids.tolist():
        cert = strategy.forget(ForgetRequest.samples([i]), data).certificate
    return cert


def run_tradeoff(
    epsilons: Sequence[float] = EPSILONS,
    *,
    delta: float = 1e-5,
    epochs: int = 15,
    batch_size: int = 32,
    fraction: float = 0.05,
    seed: int = 0,
    methods: Sequence[str] = METHODS,
    log: Callable[[str], None] = print,
    trainer_kwargs: Mapping[str, Any] | None = None,
    data: Any = None,
) -> tuple[list[dict[str, Any]], _Setup]:
    """Rows of the privacy-utility table (one per method and epsilon, ``inf`` = noise-free) and the setup;
    ``trainer_kwargs`` (e.g. ``accelerator``, ``logger``) go to every fit's ``Trainer``; ``data`` (default: digits)
    is ``"mnist-5k"`` (:class:`~lightning_unlearn_bench.datasets.MNIST5k`), a user's LightningDataModule or
    ``(train, test)`` pair (:func:`tradeoff_splits`)."""
    setup = _Setup(
        epochs=epochs,
        batch_size=batch_size,
        fraction=fraction,
        delta=delta,
        seed=seed,
        trainer_kwargs=trainer_kwargs or {},
        data=data,
    )
    r = setup.recipe
    log(
        f"recipe: lr = {r.lr:.4g}, l2 = {r.l2:g} (M = {r.smoothness:.4g}, G = {r.grad_bound:.4g}, rho = {r.rho:.4f}, "
        f"T = {r.steps}); "
        f"{setup.m} single-sample requests"
    )
    rows: list[dict[str, Any]] = []
    grid = [math.inf, *epsilons]
    if {"resolve", "certified_removal"} & set(methods):
        rows += _head_rows(setup, grid, methods, log)
    if {"hf", "safe"} & set(methods):
        # HF's vectors of the samples the schedule forgets (the others are never read: one HVP per tracked sample
        # and step is the fit's cost); the batches of every step for the same-batches retrain
        model, rec = setup.linear(), TrajectoryRecorder(dtype=torch.float64, track=setup.forget_ids.tolist())
        srec, batches = SAFERecorder(setup.num_classes, seed=seed), _BatchIds()
        constants = module_constants(model, [setup.x])
        _trainer([rec, srec, batches], epochs, setup.trainer_kwargs).fit(model, setup.loader(setup.x, setup.y))
        retrain = setup._sgd(setup.x[setup.keep], setup.y[setup.keep], seed)
        retrain_acc = accuracy(retrain, setup.test, setup.num_classes)
        shadows = setup.shadows(lambda x, y: setup._sgd(x, y, seed))
        rows.append(_row("retrain[sgd]", math.inf, retrain, model, retrain_acc, setup, shadows))
        same = _retrain_same_batches(setup, rec, batches.ids)
        rows.append(_row("retrain[sgd,same batches]", math.inf, same, model, retrain_acc, setup, shadows))
        rows.append(_row("never_forgot[sgd]", math.inf, model, model, retrain_acc, setup, shadows))
        theta = constants.grad_bound / (2 * constants.strong_convexity)
        for eps in grid:
            if "hf" in methods:
                m2, r2 = copy.deepcopy(model), copy.deepcopy(rec)
                hf_strategy = unlearner(
                    "hf",
                    m2,
                    r2,
                    constants=constants,
                    release=_release_at(eps, delta),
                )
                rows.append(_row("hf", eps, m2, model, retrain_acc, setup, shadows, _requests(setup, hf_strategy)))
                log(_line(rows[-1]))
            if "safe" in methods:
                m2, sr2 = copy.deepcopy(model), copy.deepcopy(srec)
                safe_strategy = unlearner(
                    "safe",
                    m2,
                    sr2,
                    constants=constants,
                    trajectory=rec,
                    weight_bound=theta,
                    expected_rounds=setup.m,
                    release=ReleaseConfig(
                        epsilon=None if eps == math.inf else eps, delta=None if eps == math.inf else delta
                    ),
                )
                cert = _requests(setup, safe_strategy, setup.train)
                rows.append(
                    _row("safe", eps, m2, model, retrain_acc, setup, shadows, cert if eps != math.inf else None)
                )
                log(_line(rows[-1]))
    if {"ccl_hessian", "ccl_gradient"} & set(methods):
        model, hrec, check = setup.proximal(), CCLHessianRecorder(hessian="exact"), TaskOptimality(1e-4)
        setup.fit_proximal(model, setup.x, setup.y, [hrec, check])
        retrain = setup.fit_proximal(setup.proximal(), setup.x[setup.keep], setup.y[setup.keep], [])
        retrain_acc = accuracy(retrain, setup.test, setup.num_classes)
        shadows = setup.shadows(lambda x, y: setup.fit_proximal(setup.proximal(), x, y, []))
        rows.append(_row("retrain[lbfgs]", math.inf, retrain, model, retrain_acc, setup, shadows))
        rows.append(_row("never_forgot[lbfgs]", math.inf, model, model, retrain_acc, setup, shadows))
        constants = linear_model_constants(setup.feature_norm, setup.recipe.l2, init_norm=0.0)
        for eps in grid:
            for name in ("ccl_hessian", "ccl_gradient"):
                if name not in methods:
                    continue
                # the recorded Hessians (d^2 floats each, 490 MB at MNIST's d = 7,850) are read, never written: shared
                m2, hr2 = copy.deepcopy(model), copy.deepcopy(hrec, {id(H): H for H in hrec.hessians})
                ccl_strategy = unlearner(
                    name,
                    m2,
                    hr2,
                    constants=constants,
                    optimality=check,
                    release=_release_at(eps, delta),
                )
                cert = _requests(setup, ccl_strategy, setup.train if ccl_strategy.reads_data else None)
                rows.append(_row(name, eps, m2, model, retrain_acc, setup, shadows, cert))
                log(_line(rows[-1]))
    return rows, setup


def _head_rows(
    setup: _Setup, grid: Sequence[float], methods: Sequence[str], log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The certified softmax head's rows: its exact retrain, the head before any request (``never_forgot[head]``),
    ``resolve`` at every epsilon (noise-free at ``inf``), ``certified_removal`` at every finite epsilon (a head
    trained with that epsilon's loss perturbation)."""
    model, recorder = setup.fit_head()
    problem = recorder.problem(recorder.rows_of(setup.forget_ids.to(torch.long)).logical_not())
    retrain = setup.head()
    recorder.write_weights(retrain, convex.solve(problem, torch.zeros_like(recorder.solved_head), 1e-10).W)
    retrain_acc = accuracy(retrain, setup.test, setup.num_classes)
    shadows = setup.shadows(lambda x, y: setup.fit_head(x, y)[0])
    rows = [
        _row("retrain[exact]", math.inf, retrain, model, retrain_acc, setup, shadows),
        _row("never_forgot[head]", math.inf, model, model, retrain_acc, setup, shadows),
    ]
    for row in rows:
        log(_line(row))
    for eps in grid:
        if "resolve" in methods:
            m2, r2 = copy.deepcopy(model), copy.deepcopy(recorder)
            strategy: Any = unlearner(
                "resolve",
                m2,
                r2,
                release=_release_at(eps, setup.delta),
            )
            rows.append(_row("resolve", eps, m2, model, retrain_acc, setup, shadows, _requests(setup, strategy)))
            log(_line(rows[-1]))
        if "certified_removal" in methods and eps != math.inf:
            beta = CertifiedRemovalUnlearner.perturbation_std(CR_BUDGET, eps, setup.delta)
            m2, r2 = setup.fit_head(loss_perturbation=beta)
            before = copy.deepcopy(m2)  # its own trained model: the perturbed objective's
            strategy = unlearner("certified_removal", m2, r2, epsilon=eps, delta=setup.delta)
            cert = _requests(setup, strategy)
            rows.append(_row("certified_removal", eps, m2, before, retrain_acc, setup, shadows, cert))
            log(_line(rows[-1]))
    return rows


class _BatchIds(L.Callback):
    """The sample ids of every training batch, in step order (one plain SGD step per batch)."""

    def __init__(self) -> None:
        self.ids: list[Tensor] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.ids.append(unpack_batch(batch)[2].cpu())


def _retrain_same_batches(setup: _Setup, rec: TrajectoryRecorder, steps: Sequence[Tensor]) -> SupervisedClassifier:
    """The linear model retrained by :func:`hf.replay_sgd` over the batches of the fit ``rec`` recorded (each step's
    sample ids ``steps``, the rows of ``setup.x``; ``rec``: its step sizes and batch sizes), without the forgotten
    samples.

    Raises:
        ValueError: ``steps`` are not the batches of ``rec``'s steps.
    """
    if [len(ids) for ids in steps] != rec.batch_sizes:
        raise ValueError(f"{len(steps)} logged batches for the {rec.n_steps} steps the TrajectoryRecorder recorded")
    model = setup.linear()
    batches = [(setup.x[ids[setup.keep[ids]]], setup.y[ids[setup.keep[ids]]]) for ids in steps]
    theta = hf.replay_sgd(
        autodiff.ModuleLoss(model, setup.recipe.l2), autodiff.flat_params(model), batches, rec.lrs, rec.batch_sizes
    )
    autodiff.set_flat_params(model, theta)
    return model


def _line(row: dict[str, Any]) -> str:
    return "  ".join(f"{k}={_fmt(row[k])}" for k in COLUMNS)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if v == math.inf else f"{v:.4g}"
    return str(v)


def format_tradeoff(rows: Sequence[dict[str, Any]], name: str = "digits") -> str:
    """The table: one line per (method, epsilon); ``name``: the data's (:attr:`_Setup.name`)."""
    from lightning_unlearn_bench.report import format_table

    head = [
        "method",
        "eps",
        "test acc %",
        "retrain %",
        "gap pp",
        "sigma",
        "sensitivity",
        "eps total",
        "K",
        "certified",
        "MIA-U",
        "LiRA",
    ]
    body = [
        [
            r["method"],
            _fmt(r["epsilon"]),
            f"{100 * r['test_acc']:.2f}",
            f"{100 * r['retrain_acc']:.2f}",
            f"{r['gap_pp']:.2f}",
            _fmt(r["sigma"]),
            _fmt(r["sensitivity"]),
            _fmt(r["epsilon_total"]),
            str(r["releases"]),
            "yes" if r["certified"] else "no",
            f"{r['mia_u_auc']:.3f}",
            f"{r['lira_auc']:.3f}",
        ]
        for r in rows
    ]
    return format_table(
        head,
        body,
        title=f"Privacy-utility tradeoff ({name}, L2-regularised logistic regression, single-sample deletions)",
    )


def write_tradeoff(
    rows: Sequence[dict[str, Any]], recipe: Recipe, out_dir: str | Path, name: str = "digits", num_classes: int = 10
) -> list[Path]:
    """``tradeoff.csv`` and ``tradeoff.png`` (test accuracy vs epsilon, log scale, retraining dashed; chance is
    ``1/num_classes``; ``name``: the data's)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / "tradeoff.csv", out / "tradeoff.png"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows([{k: r[k] for k in COLUMNS} for r in rows])
    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    styles = {
        "resolve": ("C4", "*"),
        "certified_removal": ("C5", "v"),
        "hf": ("C0", "o"),
        "ccl_hessian": ("C1", "s"),
        "ccl_gradient": ("C2", "^"),
        "safe": ("C3", "D"),
    }
    for method, (colour, marker) in styles.items():
        pts = [r for r in rows if r["method"] == method and r["epsilon"] != math.inf]
        if not pts:
            continue
        ax.plot(
            [r["epsilon"] for r in pts], [100 * r["test_acc"] for r in pts], marker=marker, color=colour, label=method
        )
        free = [r for r in rows if r["method"] == method and r["epsilon"] == math.inf]
        if free:
            ax.axhline(100 * free[0]["test_acc"], color=colour, ls=":", lw=1)
    references = (
        ("retrain[exact]", "-"),
        ("retrain[sgd]", "--"),
        ("retrain[sgd,same batches]", ":"),
        ("retrain[lbfgs]", "-."),
    )
    for ref, ls in references:
        hit = [r for r in rows if r["method"] == ref]
        if hit:
            ax.axhline(100 * hit[0]["test_acc"], color="k", ls=ls, lw=1, label=ref)
    ax.axhline(100 / num_classes, color="0.6", lw=0.8)
    ax.text(0.11, 100 / num_classes + 1.5, "chance", color="0.4", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(r"per-release $\varepsilon$ ($\delta = 10^{-5}$)")
    ax.set_ylabel("test accuracy after all requests (%)")
    ax.set_ylim(0, 100)
    methods = {r["method"] for r in rows}
    settings = [f"head $\\lambda$={HEAD_L2:g}"] if methods & {"resolve", "certified_removal"} else []
    head_rows = {"resolve", "certified_removal", "retrain[exact]", "never_forgot[head]"}
    if methods - head_rows:  # the SGD-trained seed methods' recipe
        settings.insert(0, f"SGD lr={recipe.lr:.3g}, $\\lambda$={recipe.l2:g}")
    ax.set_title(f"Certified unlearning, {name} LR ({'; '.join(settings)}); dotted: noise-free", fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=200)
    return [csv_path, png_path]
