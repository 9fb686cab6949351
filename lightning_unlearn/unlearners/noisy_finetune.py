"""`NoisyFinetuneUnlearner`: certified forgetting by noisy fine-tuning on the retained data ([CUNN], [LU]).

A request copies the module, projects its trainable parameters onto a ball of radius ``radius`` (``C0``) around a
fixed centre, runs ``steps`` noisy steps on the retained data and publishes the result; the privacy analysis is
:mod:`lightning_unlearn.privacy.amplification` ([PABI]), derived in ``docs/noisy_finetuning.md``.

Each step (``update="clip_gradient"``, [CUNN]'s gradient clipping; with ``model_radius``, its model clipping too)::

    theta <- (1 - lr lambda) theta - lr clip_C1(g(theta))      g: the gradient of the module's own loss on a batch
    theta <- centre + proj_R(theta - centre)                (only with model_radius R)
    theta <- theta + N(0, sigma^2 I)                        (OS entropy; under DDP rank 0's result is published)

The map is Lipschitz up to the shift ``2 lr C1`` *for any loss*, so the certificate needs no convexity: it holds for
deep networks, BatchNorm and dropout included. ``update="convex"`` takes plain gradient steps on the mean
cross-entropy plus ``(lambda/2)||theta||^2`` of a linear softmax head on fixed features (checked with
:func:`~lightning_unlearn.functional.bounds.linear_head`), contractive with ``rho = max(|1 - lr lambda|, |1 - lr M|)``,
``M`` the closed-form smoothness over the retained inputs: no shift, but only for that model.

What is certified: the published model is (epsilon, delta)-indistinguishable from the same request run from a model
retrained on the retained data (by any training algorithm: both starts lie in the ball, at most ``2 C0`` apart),
and, since every later request starts from the published model and reads only data without the forgotten samples,
so is everything published afterwards (post-processing) [derived]. A small ``radius`` makes the start a reset (the
centre, e.g. the initial weights): the method then costs what a retrain does, plus the noise.

State that could carry the forgotten samples and is not in the analysis: BatchNorm running statistics are reset
before the steps and recomputed from the retained data after them (:func:`torch.optim.swa_utils.update_bn`); another
buffer that forward passes change is refused; frozen parameters and other buffers are assumed never trained on
forgettable samples (stated in the certificate, not checkable). No noise-free copy is kept: the next request starts
from the published model.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any, cast

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.optim.swa_utils import update_bn
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.contract import LossFn, resolve_loss_fn, training_loss, trains_itself, unpack_batch
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional.bounds import linear_head, linear_model_constants, max_feature_norm
from lightning_unlearn.modes import eval_mode, module_device
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.privacy.accountant import PrivacyAccountant, Release
from lightning_unlearn.privacy.amplification import Amplification, NoisySteps, calibrate_sigma, rdp_coefficient
from lightning_unlearn.privacy.noise import secure_gaussian
from lightning_unlearn.progress import QUIET_TRAINER, quiet_lightning, status
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, UnlearningUpdate
from lightning_unlearn.unlearners.baselines import id_rows, norms_in_eval, trained_weights
from lightning_unlearn.unlearners.release import ReleasingUnlearner, all_finite
from lightning_unlearn.warnings import warn

UPDATES = ("clip_gradient", "convex")
_BATCH_NORMS = (nn.modules.batchnorm._BatchNorm,)
#: a clipped or projected vector is scaled a few ulp inside its ball, so that rounding never leaves it
_INSIDE = 4


class NoisyFinetuneUnlearner(ReleasingUnlearner):
    """Forget by noisy fine-tuning on the retained data from a projected start (module docstring; [CUNN], [PABI]).

    Args:
        module, recorder, ledger: see :class:`~lightning_unlearn.unlearners.base.Unlearner` (any recorder:
            only its catalog is read).
        train: the training data (``(x, y, sample_id, ...)`` items or dicts); the retained set is every learned,
            not yet forgotten sample of it outside the request.
        steps: ``T``, the noisy steps per request.
        lr: the step size ``eta``.
        clip: ``C1``, the gradient's L2 norm bound over all trainable parameters (``update="clip_gradient"``).
        radius: ``C0``: the start is projected onto the ball of this radius around ``center`` (``D = 2 C0``).
        center: the ball's centre, by parameter name (e.g. the module's initial ``state_dict``; only the trainable
            parameters are read); ``None``: zero. It must not depend on data that can be forgotten.
        weight_decay: ``lambda`` of the steps (the ridge of ``update="convex"``, which needs it positive).
        model_radius: ``R``: each step's result is projected onto the ball of radius ``R`` around ``center`` before
            its noise ([CUNN]'s model clipping); ``None``: no projection.
        update: ``"clip_gradient"`` (any module and loss) or ``"convex"`` (a linear softmax head, see above).
        batch_size: retained samples per step; ``None``: the whole retained set (full-batch steps).
        finetune_epochs: noise-free epochs on the retained data after the noisy steps, with the module's own
            ``training_step`` and ``configure_optimizers`` (post-processing: no privacy cost; needs a module that
            trains itself).
        loss_fn: per-sample loss for a module that does not train itself (default cross-entropy).
        generator: orders the retained batches and seeds dropout (not secret: the bound holds for every draw).
        release: the noise, its calibration and accounting (:class:`~lightning_unlearn.privacy.ReleaseConfig`);
            it needs an (epsilon, delta) target and the ``"rdp"`` accountant (the amplification bound is a
            Renyi-DP bound), as :attr:`default_release` has.

    Raises:
        ValueError: a bad option (named), a release without a target or with another accountant,
            ``update="convex"`` on a module that is not a linear head, or ``finetune_epochs`` for a module without
            its own training recipe.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (ForgetRequest, IndexedDataset, NoisyFinetuneUnlearner, ReleaseConfig,
        ...                                SampleRecorder, SupervisedClassifier)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = SupervisedClassifier(torch.nn.Linear(4, 3)), SampleRecorder()
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> release = ReleaseConfig(epsilon=1.0, delta=1e-5, accountant="rdp")  # noise from OS entropy
        >>> unlearn = NoisyFinetuneUnlearner(model, recorder, data, steps=10, release=release)
        >>> certificate = unlearn.forget(ForgetRequest.samples([3, 7])).certificate  # 10 clipped noisy steps
        >>> certificate.certified, certificate.epsilon, round(certificate.sigma, 2)  # sigma from the PABI bound
        (True, 1.0, 3.84)
    """

    method = "noisy_finetune"
    method_info = MethodInfo(
        guarantee="(epsilon, delta) by amplification by iteration: noisy steps from a projected start ([CUNN])",
        assumptions="any loss and module (clipped gradients); update='convex': a linear softmax head (no shift)",
        cost="`steps` noisy steps on the retained data per request (plus optional noise-free epochs)",
        paper="CUNN, PABI",
    )
    default_release = ReleaseConfig(accountant="rdp")

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset,
        ledger: Ledger | None = None,
        *,
        steps: int = 100,
        lr: float = 0.05,
        clip: float = 1.0,
        radius: float = 1.0,
        center: Mapping[str, Tensor] | None = None,
        weight_decay: float = 0.0,
        model_radius: float | None = None,
        update: str = "clip_gradient",
        batch_size: int | None = 256,
        finetune_epochs: int = 0,
        loss_fn: LossFn | None = None,
        generator: torch.Generator | None = None,
        release: ReleaseConfig | None = None,
    ) -> None:
        _check_options(steps, lr, clip, radius, weight_decay, model_radius, update, batch_size, finetune_epochs)
        if update == "convex":
            linear_head(module)  # raises unless the trainable parameters are one final nn.Linear
            if loss_fn is not None:
                raise ValueError("update='convex' steps on the cross-entropy of the linear head: loss_fn is not used")
        if finetune_epochs and not trains_itself(module):
            raise ValueError(
                f"finetune_epochs trains with the module's own training_step and configure_optimizers; "
                f"{type(module).__name__} has none (a LightningModule with automatic optimization needs both)"
            )
        super().__init__(module, recorder, ledger, release=release)
        self._target()  # (epsilon, delta) are required: the noise is calibrated on them
        if self.release.accountant != "rdp":
            raise ValueError(
                "noisy_finetune accounts with the RDP accountant only (its amplification bound is a Renyi-DP bound; "
                "a PLD accountant's Gaussian composition would not follow from it): give ReleaseConfig(accountant="
                f"'rdp'), got accountant={self.release.accountant!r}"
            )
        self.train_data = train
        self.steps, self.lr, self.clip, self.radius = int(steps), float(lr), float(clip), float(radius)
        self.weight_decay = float(weight_decay)
        self.model_radius = None if model_radius is None else float(model_radius)
        self.update, self.batch_size, self.finetune_epochs = update, batch_size, int(finetune_epochs)
        self.loss_fn = resolve_loss_fn(module, loss_fn)
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.center = _flat_center(module, center)
        self._rows = id_rows(train, recorder.batch_keys)

    # -- the analysis ------------------------------------------------------------------------------------------
    def unit_steps(self, retained: Subset) -> NoisySteps:
        """The request's steps with ``sigma = 1`` (:class:`~lightning_unlearn.privacy.amplification.NoisySteps`):
        ``update="convex"`` reads the largest feature norm of the retained inputs for the smoothness ``M``."""
        radius = math.inf if self.model_radius is None else self.model_radius
        if self.update == "clip_gradient":
            return NoisySteps.clipped_gradient(
                self.steps, lr=self.lr, clip=self.clip, sigma=1.0, l2=self.weight_decay, radius=radius
            )
        features, head = linear_head(self.module)
        keys = self.recorder.batch_keys
        device = module_device(self.module)
        inputs = (unpack_batch(b, keys)[0].to(device) for b in DataLoader(retained, batch_size=1024))
        constants = linear_model_constants(
            max_feature_norm(features, inputs), self.weight_decay, bias=head.bias is not None
        )
        return NoisySteps.convex(
            self.steps,
            lr=self.lr,
            smoothness=constants.smoothness,
            strong_convexity=constants.strong_convexity,
            sigma=1.0,
            radius=radius,
        )

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        epsilon, delta, accountant = self._target()
        retained = self._retained(ids)
        unit = self.unit_steps(retained)
        start_distance = 2 * self.radius
        bound = rdp_coefficient(start_distance, unit)  # c(1); c(sigma) = c(1) / sigma^2
        calibrated = calibrate_sigma(epsilon, delta, start_distance, unit)
        sigma = self.release.noise_std(calibrated)
        # a Gaussian release with the same RDP curve: noise multiplier sigma / sqrt(2 c(1)) = 1 / sqrt(2 c(sigma))
        release = Release(sigma=sigma, sensitivity=math.sqrt(2 * bound.coefficient), epsilon=epsilon, delta=delta)
        accountant = accountant.with_release(release)
        accountant.check_budget(self.release.total_budget)  # before any work: a refused request spends nothing

        work = copy.deepcopy(self.module)
        params = [p for p in work.parameters() if p.requires_grad]
        buffers = _other_buffers(work)
        _reset_norms(work)
        status(f"{self.method}: request {len(self.history) + 1}: {self.steps} noisy steps on {len(retained)} samples")
        with torch.random.fork_rng():  # dropout's masks: reproducible from the generator, not secret
            torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=self.generator)))
            samples = self._noisy_steps(work, params, retained, sigma, len(accountant))
        if self.finetune_epochs:
            self._finetune(cast(L.LightningModule, work), retained)
        self._recompute_norms(work, retained)
        _check_buffers(work, buffers)
        for tensor in [*work.parameters(), *work.buffers()]:  # under DDP every rank publishes rank 0's release
            tensor.data = self.recorder.broadcast_from_rank0(tensor.data)
        if not all_finite(parameters_to_vector(params).detach()):
            raise ValueError(f"{self.method}: the published model is not finite; lower lr or raise clip")

        accounting = {**accountant.totals(delta), "release": asdict(release)}
        certificate = Certificate(
            method=self.method,
            exact=False,
            epsilon=epsilon if self.release.calibrated else None,
            delta=delta if self.release.calibrated else None,
            sigma=sigma if self.release.noise else None,
            bounds=self._bounds(unit, bound, sigma, calibrated, start_distance),
            statement=self._statement() + self.release.uncertified_note,
            constants="bounded",
            recipe="checked",
            seeded=self.release.seed is not None and sigma > 0,
            accounting=accounting,
            assumptions=self._assumptions(work),
        )
        gradient_evaluations = samples + self.finetune_epochs * self._finetune_size(retained)[1]
        return UnlearningUpdate(
            certificate,
            weights=trained_weights(work),
            state={"accountant": accountant},
            extra={
                "n_forgotten": int(ids.numel()),
                "n_retained": len(retained),
                "steps": self.steps,
                "finetune_epochs": self.finetune_epochs,
                "gradient_evaluations": gradient_evaluations,
                "forward_evaluations": len(retained) if _has_norms(work) else 0,  # recomputing BatchNorm statistics
            },  # nothing measured on the trajectory (gradient norms, the start's distance): it would describe the
            # model before the noise, which saw the forgotten samples
        )

    def _target(self) -> tuple[float, float, PrivacyAccountant]:
        if self.accountant is None:
            raise ValueError(f"{self.method} calibrates its noise on (epsilon, delta): its release has none")
        return (*self.release.target(), self.accountant)

    def _bounds(
        self, unit: NoisySteps, bound: Amplification, sigma: float, calibrated: float, start_distance: float
    ) -> dict[str, float]:
        """The certificate's numbers: ``rdp_coefficient`` is ``c`` at the noise used (``D_alpha <= alpha c``)."""
        if bound.coefficient == 0:
            coefficient = 0.0
        else:
            coefficient = bound.coefficient / sigma**2 if sigma > 0 else math.inf
        return {
            "sigma_formula": calibrated,
            "start_distance": start_distance,
            "rho": unit.rho[0],
            "shift": unit.shift[0],
            "rdp_coefficient": coefficient,
            "chain_start": float(bound.start),
            "steps": float(self.steps),
            "lr": self.lr,
            "clip": self.clip if self.update == "clip_gradient" else math.inf,
            "weight_decay": self.weight_decay,
            "radius": self.radius,
            "model_radius": math.inf if self.model_radius is None else self.model_radius,
        }

    def _statement(self) -> str:
        return (
            "[PABI] Theorem 22, [CUNN] ([derived] constants, docs/noisy_finetuning.md): D_alpha <= alpha c between "
            "this release and the same request started from a model retrained on the retained data; (epsilon, "
            "delta) by dp-accounting's RDP conversion; for the forgotten samples every later release is covered too "
            "(post-processing of this one)"
        )

    def _assumptions(self, work: nn.Module) -> list[str]:
        """What the bound rests on, one line each: checked by construction, or stated (not checkable)."""
        lines = [
            f"checked (by construction): the start is projected onto the ball of radius C0 = {self.radius:g} around "
            "a fixed centre, so any trained and any retrained model start at most D = 2 C0 apart"
        ]
        if self.update == "clip_gradient":
            lines.append(
                f"checked (by construction): each step x -> (1 - lr lambda) x - lr clip_C1(g(x)) with the gradient's "
                f"global norm clipped to C1 = {self.clip:g} is Lipschitz up to the shift 2 lr C1 for any loss "
                "(no convexity or smoothness assumed)"
            )
        else:
            lines.append(
                "bounded (closed form): gradient steps on the lambda-strongly convex, M-smooth cross-entropy of the "
                "linear head (M from the retained inputs' largest norm, features fixed, eval mode) contract by "
                "max(|1 - lr lambda|, |1 - lr M|)"
            )
        if self.model_radius is not None:
            lines.append(f"checked (by construction): every step is projected onto the radius {self.model_radius:g}")
        lines.append(
            "checked: the steps read only the retained data; batches and dropout masks do not depend on the "
            "forgotten samples; the noise is Gaussian from the OS entropy"
            if self.release.seed is None
            else "FAILS: the noise is seeded (reproducible): not private"
        )
        if self.update == "clip_gradient" and trains_itself(work):
            lines.append(
                "stated, not checkable: the module's training_step reads only the batch and the parameters (no state "
                "learned from data, e.g. a stored anchor or teacher)"
            )
        lines.append(
            "checked: BatchNorm running statistics reset before the steps and recomputed from the retained data"
        )
        if self.finetune_epochs:
            lines.append(
                f"checked: {self.finetune_epochs} noise-free epochs on the retained data only (post-processing)"
            )
        frozen = sum(p.numel() for p in work.parameters() if not p.requires_grad)
        if frozen:
            lines.append(f"stated, not checkable: {frozen} frozen parameters were never trained on forgettable samples")
        others = [n for n, _ in _other_buffers(work)]
        if others:
            lines.append(f"checked unchanged; stated data-independent (not checkable): buffers {others[:5]}")
        lines.append("not modelled: floating-point rounding of the updates (as in DP-SGD implementations)")
        return lines

    # -- the steps -------------------------------------------------------------------------------------------------
    def _retained(self, ids: Tensor) -> Subset:
        active = self.catalog.active_ids()
        keep = active[~torch.isin(active, ids)].tolist()
        if not keep:
            raise ValueError(f"{self.method}: no retained samples would be left to fine-tune on")
        missing = [i for i in keep if i not in self._rows]
        if missing:
            raise ValueError(
                f"{self.method}: the training data lacks {len(missing)} retained sample ids, e.g. {missing[:10]}"
            )
        return Subset(self.train_data, [self._rows[i] for i in keep])

    def _batches(self, retained: Subset) -> Iterator[Any]:
        size = len(retained) if self.batch_size is None else min(self.batch_size, len(retained))
        while True:
            yield from DataLoader(retained, batch_size=size, shuffle=True, generator=self.generator)

    def _loss(self, work: nn.Module, batch: Any, index: int) -> Tensor:
        batch = move_data_to_device(batch, module_device(work))
        x, y, _ = unpack_batch(batch, self.recorder.batch_keys)
        if self.update == "convex":
            with eval_mode(work):  # fixed features: the head's loss is the convex one the constants bound
                return nn.functional.cross_entropy(work(x), y.long())
        with norms_in_eval(work, len(y) == 1):
            if trains_itself(work):
                return training_loss(work, batch, index)
            return self.loss_fn(work(x), y).mean()

    def _noisy_steps(
        self, work: nn.Module, params: list[nn.Parameter], retained: Subset, sigma: float, release: int
    ) -> int:
        """Project the start, then run the steps in place on ``params``; return the samples they read."""
        work.train()
        theta = parameters_to_vector(params).detach()
        center = self.center.to(theta)
        theta = _project(theta, center, self.radius)
        draw = _noise_source(self.release.seed, release, self.method)
        batches, samples = self._batches(retained), 0
        decay = 1.0 - self.lr * self.weight_decay
        for t in range(self.steps):
            vector_to_parameters(theta, params)
            batch = next(batches)
            loss = self._loss(work, batch, t)
            if not torch.isfinite(loss):
                raise ValueError(f"{self.method}: the loss became {float(loss)} at step {t}; lower lr")
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            g = torch.cat([(torch.zeros_like(p) if d is None else d).reshape(-1) for p, d in zip(params, grads)])
            if self.update == "clip_gradient":
                norm = float(g.double().norm())
                if norm > self.clip:
                    g = g * (self.clip / norm * (1 - _INSIDE * torch.finfo(g.dtype).eps))
            theta = decay * theta - self.lr * g.detach()
            if self.model_radius is not None:
                theta = _project(theta, center, self.model_radius)
            if sigma > 0:
                theta = theta + (sigma * draw(theta.numel())).to(theta)
            samples += len(unpack_batch(batch, self.recorder.batch_keys)[1])
        vector_to_parameters(theta, params)
        return samples

    def _finetune_size(self, retained: Subset) -> tuple[int, int]:
        """The noise-free epochs' batch size and samples per epoch (a last partial batch is dropped: BatchNorm)."""
        size = min(self.batch_size or len(retained), len(retained))
        return size, len(retained) // size * size

    def _finetune(self, work: L.LightningModule, retained: Subset) -> None:
        size = self._finetune_size(retained)[0]
        loader = DataLoader(
            retained, batch_size=size, shuffle=True, generator=self.generator, drop_last=len(retained) > size
        )
        trainer_kwargs = {**QUIET_TRAINER, "num_sanity_val_steps": 0, "limit_val_batches": 0, "devices": 1}
        with quiet_lightning(), torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=self.generator)))
            L.Trainer(max_epochs=self.finetune_epochs, **trainer_kwargs).fit(work, loader)

    def _recompute_norms(self, work: nn.Module, retained: Subset) -> None:
        """BatchNorm running statistics of the published parameters, from the retained data only."""
        if not _has_norms(work):
            return
        keys, device = self.recorder.batch_keys, module_device(work)
        size = min(256, len(retained))
        loader = DataLoader(retained, batch_size=size, drop_last=len(retained) > size)
        update_bn((unpack_batch(b, keys)[0].to(device) for b in loader), work)


def _check_options(
    steps: int,
    lr: float,
    clip: float,
    radius: float,
    weight_decay: float,
    model_radius: float | None,
    update: str,
    batch_size: int | None,
    finetune_epochs: int,
) -> None:
    """One ``ValueError`` per bad option, naming it."""
    if update not in UPDATES:
        raise ValueError(f"noisy_finetune update must be one of {UPDATES}, got {update!r}")
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"noisy_finetune steps must be an integer >= 1, got {steps!r}")
    for name, value in (("lr", lr), ("clip", clip)):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"noisy_finetune {name} must be positive and finite, got {value}")
    if not (radius >= 0 and math.isfinite(radius)):
        raise ValueError(
            f"noisy_finetune radius (C0) must be finite and >= 0, got {radius}: without a projected start nothing "
            "bounds the distance between the unlearned and a retrained model"
        )
    if not (weight_decay >= 0 and math.isfinite(weight_decay)) or (update == "convex" and not weight_decay > 0):
        raise ValueError(
            f"noisy_finetune weight_decay must be finite and >= 0 (> 0 for update='convex'), got {weight_decay}"
        )
    if model_radius is not None and not (model_radius >= 0 and math.isfinite(model_radius)):
        raise ValueError(f"noisy_finetune model_radius must be finite and >= 0, got {model_radius}")
    if batch_size is not None and not batch_size >= 1:
        raise ValueError(f"noisy_finetune batch_size must be >= 1 (or None: full batch), got {batch_size}")
    if not finetune_epochs >= 0:
        raise ValueError(f"noisy_finetune finetune_epochs must be >= 0, got {finetune_epochs}")


def _flat_center(module: nn.Module, center: Mapping[str, Tensor] | None) -> Tensor:
    """The centre as a flat vector over the trainable parameters (zeros for ``None``)."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if center is None:
        return torch.zeros(sum(p.numel() for _, p in named), dtype=torch.float64)
    missing = [n for n, _ in named if n not in center]
    if missing:
        raise ValueError(f"noisy_finetune center lacks the trainable parameters {missing[:5]}")
    bad = [n for n, p in named if tuple(center[n].shape) != tuple(p.shape)]
    if bad:
        raise ValueError(f"noisy_finetune center has shapes that differ from the module's for {bad[:5]}")
    return torch.cat([center[n].detach().double().reshape(-1).cpu() for n, _ in named])


def _project(theta: Tensor, center: Tensor, radius: float) -> Tensor:
    """``center + proj_radius(theta - center)``."""
    offset = theta - center
    norm = float(offset.double().norm())
    if norm <= radius:
        return theta
    return center + offset * (radius / norm * (1 - _INSIDE * torch.finfo(theta.dtype).eps))


def _noise_source(seed: int | None, release: int, method: str) -> Any:
    """``draw(n)``: ``n`` standard normals, from the OS entropy (``seed=None``) or a generator seeded with
    ``seed + release`` (reproducible, not private: warns once per request)."""
    if seed is None:
        return lambda n: secure_gaussian((n,))
    warn(
        f"{method}: noise seeded from seed={seed}: reproducible, hence NOT private (anyone with the seed can remove "
        "it); the certificate is marked seeded and not certified"
    )
    g = torch.Generator().manual_seed(int(seed) + int(release))
    return lambda n: torch.randn(n, generator=g, dtype=torch.float64)


def _has_norms(work: nn.Module) -> bool:
    return any(isinstance(m, _BATCH_NORMS) for m in work.modules())


def _reset_norms(work: nn.Module) -> None:
    for m in work.modules():
        if isinstance(m, _BATCH_NORMS) and m.track_running_stats:
            m.reset_running_stats()


def _other_buffers(work: nn.Module) -> list[tuple[str, Tensor]]:
    """Buffers that are not BatchNorm statistics, with a copy of their values."""
    norms = {id(b) for m in work.modules() if isinstance(m, _BATCH_NORMS) for b in m.buffers(recurse=False)}
    return [(n, b.detach().clone()) for n, b in work.named_buffers() if id(b) not in norms]


def _check_buffers(work: nn.Module, before: list[tuple[str, Tensor]]) -> None:
    now = dict(work.named_buffers())
    changed = [n for n, b in before if not torch.equal(now[n], b)]
    if changed:
        raise ValueError(
            f"noisy_finetune: buffers {changed[:5]} change in forward passes; they are not part of the analysis and "
            "would carry what the model saw (only BatchNorm statistics are recomputed): nothing was changed"
        )
