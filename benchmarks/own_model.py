"""Every recorder and method on a user's own torchvision ``resnet18`` LightningModule (CPU).

A user-written module (torchvision ``resnet18``, 11.2M parameters, its own ``training_step`` and
SGD optimizer with weight decay, BatchNorm) learns 512 ``FakeData`` images of 32x32 in one
experience. Printed: the plain fit's time; each recorder's fit time as a ratio of the plain fit
and its statistics' memory (bytes of its ``state_dict`` tensors); each method's time for one
request of 4 samples. The machine may be shared: each recorder's ratio is to a plain fit run
right before it. [HF] follows the user's BatchNorm in training mode (the batch loss's Hessian);
ACU runs a frozen trunk with an analytic head, as [ACU] prescribes; [NS] and [IJ] (a dense Hessian) train the
last layer only. The certified rows publish
without noise (``noise=False``): a ResNet violates the strong convexity their certificates need,
and the point here is cost.

    python benchmarks/own_model.py [--samples 512] [--epochs 2] [--track 8]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from time import perf_counter
from typing import Any

import lightning as L
import torch
import torchvision
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import (
    ACUUnlearner,
    AnalyticRecorder,
    CCLGradientUnlearner,
    CCLHessianRecorder,
    CCLHessianUnlearner,
    CCLRecorder,
    ForgetRequest,
    HFUnlearner,
    IndexedDataset,
    RBMUnlearner,
    ReleaseConfig,
    SAFERecorder,
    SAFEUnlearner,
    TrajectoryRecorder,
)
from lightning_unlearn.callbacks import HessianSumRecorder, ProximalRegularizer, SampleRecorder, SoftmaxHeadRecorder
from lightning_unlearn.models import AnalyticHead, AnalyticHeadModule
from lightning_unlearn.progress import QUIET_TRAINER
from lightning_unlearn.unlearners import (
    CertifiedRemovalUnlearner,
    InfinitesimalJackknifeUnlearner,
    L1SparseUnlearner,
    NewtonStepUnlearner,
    ResolveUnlearner,
    SCRUBUnlearner,
    WoodFisherUnlearner,
)
from lightning_unlearn.unlearners.baselines import (
    FinetuneUnlearner,
    NegGradPlusUnlearner,
    NegGradUnlearner,
    RandomLabelUnlearner,
    RetrainUnlearner,
)
from lightning_unlearn.unlearners.noisy_finetune import NoisyFinetuneUnlearner

FORGET = ForgetRequest.samples([3, 14, 15, 29])


class UserResNet(L.LightningModule):
    """What a user writes: torchvision resnet18, cross-entropy, SGD with weight decay."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torchvision.models.resnet18(num_classes=10)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, weight_decay=5e-4)


class UserResNetHead(UserResNet):
    """The same module with only its last layer trained ([NS] and [IJ] hold a dense d x d Hessian: of all 11.2M
    parameters it would need 450 TiB, which their recorder refuses, naming d)."""

    def __init__(self) -> None:
        super().__init__()
        self.net.requires_grad_(False)
        self.net.fc.requires_grad_(True)


def frozen_trunk() -> nn.Module:
    """resnet18 without its last layer (512 features), frozen: the backbone under a head a recorder solves."""
    net = torchvision.models.resnet18(num_classes=10)
    net.fc = nn.Identity()
    return net.requires_grad_(False)


class UserAnalytic(AnalyticHeadModule):
    """A frozen resnet18 trunk with an analytic head ([ACU]): the recorder solves the head (AnalyticHeadModule
    supplies the warning-free training step and optimizer of a module nothing trains by gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = frozen_trunk()
        self.head = AnalyticHead(512, 10, expansion_dim=2048)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))


class UserConvex(L.LightningModule):
    """A frozen resnet18 trunk with a linear head that the :class:`SoftmaxHeadRecorder` solves (certified)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = frozen_trunk()
        self.head = nn.Linear(512, 10)
        self.automatic_optimization = False

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def configure_optimizers(self) -> None:
        return None


def fake_data(n: int) -> IndexedDataset:
    images = torchvision.datasets.FakeData(
        n, (3, 32, 32), 10, transform=torchvision.transforms.ToTensor(), random_offset=7
    )
    x = torch.stack([images[i][0] for i in range(n)])
    y = torch.tensor([int(images[i][1]) for i in range(n)])
    return IndexedDataset(TensorDataset(x, y))


def fit(module: L.LightningModule, data: IndexedDataset, epochs: int, callbacks: list[L.Callback]) -> float:
    print(f"  fitting with {[type(c).__name__ for c in callbacks] or 'no callback'}", file=sys.stderr, flush=True)
    L.seed_everything(0, verbose=False)
    loader = DataLoader(data, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    start = perf_counter()
    L.Trainer(max_epochs=epochs, callbacks=callbacks, **QUIET_TRAINER).fit(module, loader)
    return perf_counter() - start


def state_bytes(recorder: L.Callback) -> int:
    def walk(v: Any) -> int:
        if isinstance(v, Tensor):
            return v.numel() * v.element_size()
        if isinstance(v, dict):
            return sum(walk(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return sum(walk(x) for x in v)
        return 0

    return walk(recorder.state_dict())


def timed(run: Callable[[], Any]) -> float:
    start = perf_counter()
    run()
    return perf_counter() - start


def build_all(
    data: IndexedDataset, args: argparse.Namespace
) -> tuple[float, list[tuple[str, float, float, int]], list[tuple[str, Callable[[], Any]]]]:
    """Fit every recorder on its own copy of the user's module; the plain fit times, the recorder rows
    ``(name, fit s, plain fit s, statistics bytes)`` and one request per method, ready to run."""
    plain = fit(UserResNet(), data, args.epochs, [])
    rows: list[tuple[str, float, float, int]] = []
    methods: list[tuple[str, Callable[[], Any]]] = []

    # training-based methods and retrain: a SampleRecorder
    model, rec = UserResNet(), SampleRecorder()
    initial = copy.deepcopy(model.state_dict())
    t = fit(model, data, args.epochs, [rec])
    rows.append(("SampleRecorder", t, fit(UserResNet(), data, args.epochs, []), state_bytes(rec)))
    for name, make in (
        ("finetune", lambda m, r: FinetuneUnlearner(m, r, data, epochs=1)),
        ("neggrad", lambda m, r: NegGradUnlearner(m, r, epochs=1)),
        ("neggrad_plus", lambda m, r: NegGradPlusUnlearner(m, r, data, epochs=1)),
        ("randomlabel", lambda m, r: RandomLabelUnlearner(m, r, data, epochs=1)),
        ("rbm", lambda m, r: RBMUnlearner(m, r, data, masking="retain", epochs=1)),
        ("salun", lambda m, r: RBMUnlearner(m, r, data, masking="forget", epochs=1)),
        ("scrub", lambda m, r: SCRUBUnlearner(m, r, data, epochs=1)),
        ("l1_sparse", lambda m, r: L1SparseUnlearner(m, r, data, epochs=1)),
        ("woodfisher", lambda m, r: WoodFisherUnlearner(m, r, data, n_samples=4)),  # 4 x 11.2M per-sample gradients
        ("noisy_finetune", lambda m, r: NoisyFinetuneUnlearner(m, r, data, steps=2, center=initial)),
        ("retrain", lambda m, r: RetrainUnlearner(m, r, data, initial, trainer_kwargs={"max_epochs": args.epochs})),
    ):
        strategy = make(copy.deepcopy(model), copy.deepcopy(rec))
        methods.append((name, lambda s=strategy: s.forget(FORGET, data if s.reads_data else None)))

    # [SAFE]
    model, rec = UserResNet(), SAFERecorder(num_classes=10)
    reference = fit(UserResNet(), data, args.epochs, [])
    rows.append(("SAFERecorder", fit(model, data, args.epochs, [rec]), reference, state_bytes(rec)))
    safe = SAFEUnlearner(model, rec, step_size=0.05)
    methods.append(("safe", lambda: safe.forget(FORGET, data)))

    # [CCL]: task deltas and Hessians (diagonal: an exact 11M x 11M Hessian is out of reach)
    model, rec = UserResNet(), CCLRecorder()
    reference = fit(UserResNet(), data, args.epochs, [])
    t = fit(model, data, args.epochs, [rec, ProximalRegularizer(reg_lambda=1.0)])
    rows.append(("CCLRecorder", t, reference, state_bytes(rec)))
    gradient = CCLGradientUnlearner(model, rec, lipschitz=1.0, smoothness=1.0, release=ReleaseConfig(noise=False))
    methods.append(("ccl_gradient", lambda: gradient.forget(FORGET)))
    if args.hessian:  # Hutchinson probes over the whole task at 11M parameters: tens of minutes on 2 CPU cores
        model, rec = UserResNet(), CCLHessianRecorder(hessian="diagonal", n_probes=2, chunk_size=16)
        callbacks = [rec, ProximalRegularizer(reg_lambda=1.0)]
        reference = fit(UserResNet(), data, args.epochs, [])
        fitted = fit(model, data, args.epochs, callbacks)
        rows.append(("CCLHessianRecorder (diag)", fitted, reference, state_bytes(rec)))
        hessian = CCLHessianUnlearner(model, rec, lipschitz=1.0, smoothness=1.0, release=ReleaseConfig(noise=False))
        methods.append(("ccl_hessian", lambda: hessian.forget(FORGET, data)))

    # [HF]: the user's BatchNorm in training mode, vectors for `track` samples
    model, rec = UserResNet(), TrajectoryRecorder(track=range(args.track) if args.track else None)
    tracked = [i for i in FORGET.sample_ids if i < args.track] or [0]
    reference = fit(UserResNet(), data, args.epochs, [])
    t = fit(model, data, args.epochs, [rec])
    rows.append((f"TrajectoryRecorder ({args.track} tracked)", t, reference, state_bytes(rec)))
    hf = HFUnlearner(model, rec, release=ReleaseConfig(noise=False))
    methods.append(("hf", lambda: hf.forget(ForgetRequest.samples(tracked))))

    # [NS], [IJ]: the dense Hessian of the last layer (d = 5,130) at the trained model, in eval mode
    for name, form, cls in (("ns", "hessian", NewtonStepUnlearner), ("ij", "inverse", InfinitesimalJackknifeUnlearner)):
        model, rec = UserResNetHead(), HessianSumRecorder(form=form)
        reference = fit(UserResNetHead(), data, args.epochs, [])
        t = fit(model, data, args.epochs, [rec])
        rows.append((f"HessianSumRecorder ({form}, fc)", t, reference, state_bytes(rec)))
        strategy = cls(model, rec, release=ReleaseConfig(noise=False))
        methods.append((name, lambda s=strategy: s.forget(FORGET, data)))

    # [ACU]: frozen trunk + analytic head
    model, rec = UserAnalytic(), AnalyticRecorder(ridge=1.0, backbone="trunk", head="head")
    reference = fit(UserResNet(), data, 1, [])  # the analytic head is solved in one pass
    rows.append(("AnalyticRecorder", fit(model, data, 1, [rec]), reference, state_bytes(rec)))
    acu = ACUUnlearner(model, rec)
    methods.append(("acu", lambda: acu.forget(FORGET, data)))

    # the certified softmax head on the same frozen trunk: re-solve (computed certificate) and [CR] removal
    beta = CertifiedRemovalUnlearner.perturbation_std(0.1, 1.0, 1e-5)
    for name, cls in (("resolve", ResolveUnlearner), ("certified_removal", CertifiedRemovalUnlearner)):
        model = UserConvex()
        rec = SoftmaxHeadRecorder(1e-3, loss_perturbation=beta, backbone="trunk", head="head")
        rows.append((f"SoftmaxHeadRecorder ({name})", fit(model, data, 1, [rec]), reference, state_bytes(rec)))
        strategy = cls(model, rec)
        methods.append((name, lambda s=strategy: s.forget(FORGET)))

    return plain, rows, methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--track", type=int, default=8, help="samples HF keeps vectors for (track=)")
    parser.add_argument("--hessian", action="store_true", help="also the diagonal CCLHessianRecorder (slow on a CPU)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = fake_data(args.samples)
    d = sum(p.numel() for p in UserResNet().parameters())
    print(f"user resnet18: d = {d:,} parameters, {args.samples} FakeData images 32x32, {args.epochs} epochs, CPU")
    plain, rows, methods = build_all(data, args)
    print(f"\nplain fit: {plain:.1f} s\n")
    print(f"{'recorder':<32}{'fit (s)':>10}{'plain fit (s)':>15}{'x plain fit':>13}{'statistics (MiB)':>18}")
    for name, t, reference, size in rows:
        print(f"{name:<32}{t:>10.1f}{reference:>15.1f}{t / reference:>13.2f}{size / 2**20:>18.2f}")
    print(f"\n{'method':<16}{'s / request (4 samples)':>26}{'x plain fit':>13}")
    for name, run in methods:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        t = timed(run)
        print(f"{name:<16}{t:>26.3f}{t / plain:>13.3f}")


if __name__ == "__main__":
    main()
