"""`HessianSumRecorder`: the dense Hessian at the trained model, for [NS] and [IJ] ([HF] Eqs. (15), (16))."""

from __future__ import annotations

from time import perf_counter
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lightning_unlearn import contract
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.functional import autodiff, newton
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.progress import status
from lightning_unlearn.warnings import warn

FORMS = ("hessian", "inverse")
#: default limit of the dense d x d matrix the recorder stores (8 GiB)
MAX_BYTES = 8 * 2**30


class HessianSumRecorder(RecorderCallback):
    """At the end of the fit, ``sum_i hess l(w; z_i)`` over the learned samples at the trained model ``w``.

    The per-sample loss is ``l = loss_fn(module(x), y) + (l2/2)||w||^2`` with ``l2`` the optimizer's
    ``weight_decay`` (:mod:`lightning_unlearn.contract`), ``loss_fn`` checked on the first batch against the
    module's own training loss; the Hessian is evaluated in eval mode (BatchNorm statistics fixed). The
    inputs are held (on the module's device, CPU with ``offload``) until the end of the fit, then dropped.

    ``form="hessian"`` ([NS]) keeps the dense sum, which each request replaces by the sum over the samples
    it retains, and :attr:`preconditioner`, the damped inverse of the full sum, with which each request solves its
    system by conjugate gradients in ``O(d^2)`` per iteration (:func:`~lightning_unlearn.functional.newton.newton_step`;
    ``None`` when the damped Hessian is indefinite: each request then factorises); ``form="inverse"`` ([IJ])
    keeps ``(1/n sum_i H_i + damping I)^{-1}``, computed once from a Cholesky factor (LU if indefinite). Both
    keep ``w`` itself (the model the statistics belong to), the number ``n`` of learned samples, the
    stationarity ``||mean_i grad l(w; z_i)||`` (both methods assume ``w`` is the exact minimiser, warned above
    ``tolerance``), the largest per-sample gradient norm (an estimate of L) and the top eigenvalue of the mean
    Hessian (of the smoothness). :attr:`precompute_seconds` times the Hessian (and inverse).

    Storage: ``d^2`` floats ([NS]: twice), on every rank under DDP (the harness's Storage(GB) counts the
    ``state_dict`` once).
    A module whose dense ``d x d`` matrix would exceed ``max_bytes`` is refused when the fit starts, naming ``d``
    and the memory ([HF] reports both methods out of memory for ResNet-18).
    One training set only ([NS] and [IJ] are not continual): a second fit is refused.

    DDP: each rank holds the inputs of its own batches; the Hessian and gradient sums are added over the
    ranks in one all-reduce each at the end of the fit, the maxima taken over ranks.

    Args:
        form: ``"hessian"`` or ``"inverse"`` (see above).
        damping: ``c`` added to the mean Hessian ([HF] Sec. 5.1: 0.01, after Basu et al. 2021).
        max_bytes: the largest dense matrix stored (each of [NS]'s two).
        chunk_size: samples per batched derivative call (bounds peak memory).
        tolerance: stationarity above which a warning says ``w`` is not the minimiser.
        loss_fn: ``loss_fn(outputs, targets) -> (n,)`` per-sample loss (default: cross-entropy).
        offload: keep the statistics on the CPU instead of the module's device.

    Raises:
        ValueError: an unknown ``form``, or a negative ``damping``.
    """

    checks_loss_on_first_batch = True
    #: the Hessian is taken at the end of the fit, at the trained model
    records_every_epoch = True
    records_parameters = True
    #: under DDP only ids, labels and fingerprints are gathered; each rank adds its samples' Hessians
    gathers_inputs = False

    def __init__(
        self,
        form: str = "hessian",
        damping: float = 0.01,
        max_bytes: int = MAX_BYTES,
        chunk_size: int | None = 256,
        tolerance: float = 1e-3,
        loss_fn: contract.LossFn | None = None,
        offload: bool = False,
    ) -> None:
        super().__init__()
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        if not damping >= 0:
            raise ValueError(f"damping must be >= 0, got {damping}")
        self.form, self.damping, self.max_bytes = form, float(damping), int(max_bytes)
        self.chunk_size, self.tolerance, self.offload = chunk_size, tolerance, offload
        self.loss_fn: contract.LossFn = loss_fn or contract.per_sample_cross_entropy
        self.theta: Tensor | None = None  # the trained model w
        self.matrix: Tensor | None = None  # sum of the retained samples' Hessians, or the damped inverse
        self.preconditioner: Tensor | None = None  # [NS]: the damped inverse of the full sum (None if indefinite)
        self.n = 0
        self.l2: float | None = None
        self.grad_max = 0.0
        self.smoothness = 0.0
        self.stationarity = 0.0
        self.precompute_seconds = 0.0
        self._l2_of_fit: float | None = None  # the running fit's optimizer weight_decay
        self._x: list[Tensor] = []
        self._y: list[Tensor] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(form=self.form, damping=self.damping)

    def module_loss(self, module: nn.Module) -> autodiff.ModuleLoss:
        """The per-sample loss ``l`` of ``module`` (``loss_fn`` plus the recorded ridge ``l2``)."""
        return autodiff.ModuleLoss(module, float(self.l2 or 0.0), self.loss_fn)

    def check_module(self, module: nn.Module) -> None:
        """``ValueError`` if ``module``'s dense Hessian would exceed ``max_bytes`` (names d and the memory)."""
        theta = autodiff.flat_params(module)
        newton.check_dense(theta.numel(), theta.dtype, self.max_bytes, type(self).__name__)

    # -- Lightning hooks -------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check_module(pl_module)
        recipe = contract.read_optimizer(trainer.optimizers, pl_module, type(self).__name__)
        self._l2_of_fit = recipe.weight_decay
        super().on_train_start(trainer, pl_module)

    # -- recording ---------------------------------------------------------------------------------------
    def begin_experience(self, module: nn.Module) -> None:
        if self.theta is not None:
            raise ValueError(
                f"{type(self).__name__} records one training set ([NS] and [IJ] are not continual): it already holds "
                f"the Hessian of {self.n} samples; use a new recorder for a new model"
            )
        super().begin_experience(module)

    def _drop_staged(self) -> None:
        super()._drop_staged()
        self._x, self._y = [], []

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        if state["ids"].numel():
            raise ValueError(
                f"{type(self).__name__} cannot resume a fit from a checkpoint saved during it: its Hessian needs every "
                "input, and inputs are never saved; fit again from the start"
            )

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        device = self._device(module)
        self._x.append(x.detach().to(device))
        self._y.append(y.detach().to(device))

    def _device(self, module: nn.Module) -> torch.device:
        return torch.device("cpu") if self.offload else autodiff.flat_params(module).device

    def _commit(self, module: nn.Module) -> None:
        self.check_module(module)
        self.l2 = self._l2_of_fit if self._l2_of_fit is not None else self.l2
        theta = autodiff.flat_params(module)
        empty = theta.new_zeros(0)
        x = torch.cat(self._x).to(theta.device) if self._x else empty
        y = torch.cat(self._y).to(theta.device) if self._y else empty.long()
        n = int(sum(t.numel() for t in self._staged_ids))  # over all ranks
        loss, d = self.module_loss(module), theta.numel()
        status(f"{type(self).__name__}: dense Hessian over {n} samples, {d} parameters")
        start = perf_counter()
        with eval_mode(module):
            H = self.sum_over_ranks(newton.hessian_sum(loss, theta, x, y, self.chunk_size))
            grad_max, grad_sum = 0.0, torch.zeros_like(theta)
            step = self.chunk_size or max(len(x), 1)
            for k in range(0, len(x), step):
                g = autodiff.per_sample_grads(loss, theta, x[k : k + step], y[k : k + step])
                grad_max, grad_sum = max(grad_max, float(g.norm(dim=1).max())), grad_sum + g.sum(0)
        grad_sum, grad_max = self.sum_over_ranks(grad_sum), self.max_over_ranks(grad_max)
        top, _ = autodiff.top_eigenvalue(lambda v: H @ v / n, torch.ones_like(theta), 100)
        inverse, definite = newton.jackknife_inverse(H, n, self.damping)
        if not definite:
            warn(
                f"the damped mean Hessian (damping {self.damping:g}) is indefinite at the trained model (a non-convex "
                + (
                    "loss): the jackknife inverts it all the same, as [HF]'s runs do, with no guarantee"
                    if self.form == "inverse"
                    else "loss): each Newton step factorises its system (no conjugate gradients), with no guarantee"
                )
            )
        matrix, preconditioner = (inverse, None) if self.form == "inverse" else (H, inverse if definite else None)
        self.precompute_seconds = perf_counter() - start
        stationarity = float((grad_sum / n).norm())
        if stationarity > self.tolerance:
            warn(
                f"the trained model is not the minimiser: ||mean grad l|| = {stationarity:.3g} > {self.tolerance:g}; "
                "[NS] and [IJ] assume the empirical risk minimiser (not repeated; the value is the recorder's "
                "`stationarity`)",
                cause=("model not the minimiser", type(self).__name__, self.tolerance),
            )
        device = self._device(module)
        self.theta, self.matrix, self.n = theta.clone().to(device), matrix.to(device), n
        self.preconditioner = None if preconditioner is None else preconditioner.to(device)
        self.grad_max, self.smoothness, self.stationarity = grad_max, top, stationarity

    # -- state ---------------------------------------------------------------------------------------------
    def require_fitted(self) -> None:
        super().require_fitted()
        if self.theta is None or self.matrix is None:
            raise ValueError(f"{type(self).__name__} holds no Hessian")

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "theta": None if self.theta is None else self.theta.clone(),
            "matrix": None if self.matrix is None else self.matrix.clone(),
            "preconditioner": None if self.preconditioner is None else self.preconditioner.clone(),
            "n": self.n,
            "l2": self.l2,
            "grad_max": self.grad_max,
            "smoothness": self.smoothness,
            "stationarity": self.stationarity,
            "precompute_seconds": self.precompute_seconds,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        missing = [k for k in ("catalog", "theta", "matrix", "n", "l2") if state_dict.get(k) is None]
        if missing:
            raise ValueError(f"{type(self).__name__} state lacks recorded statistics {missing}")
        d = state_dict["theta"].numel()
        if tuple(state_dict["matrix"].shape) != (d, d):
            raise ValueError(
                f"inconsistent {type(self).__name__} state: a {tuple(state_dict['matrix'].shape)} matrix for d = {d}"
            )
        preconditioner = state_dict.get("preconditioner")
        if preconditioner is not None and tuple(preconditioner.shape) != (d, d):
            raise ValueError(
                f"inconsistent {type(self).__name__} state: a {tuple(preconditioner.shape)} preconditioner for d = {d}"
            )
        super().load_state_dict(state_dict)
        self.theta, self.matrix = state_dict["theta"].clone(), state_dict["matrix"].clone()
        self.preconditioner = None if preconditioner is None else preconditioner.clone()
        self.n, self.l2 = int(state_dict["n"]), float(state_dict["l2"])
        self.grad_max = float(state_dict.get("grad_max", 0.0))
        self.smoothness = float(state_dict.get("smoothness", 0.0))
        self.stationarity = float(state_dict.get("stationarity", 0.0))
        self.precompute_seconds = float(state_dict.get("precompute_seconds", 0.0))
