"""`SAFEUnlearner`: SAFE streaming unlearning ([SAFE], Algorithm 1), one request per round."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.hf import TrajectoryRecorder
from lightning_unlearn.callbacks.safe import SAFERecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.data import select_by_ids
from lightning_unlearn.functional import safe
from lightning_unlearn.functional.bounds import ModelConstants, contraction_condition, sgd_bound
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.privacy import ReleaseConfig, gaussian_noise
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, UnlearningUpdate
from lightning_unlearn.unlearners.release import Publication, ReleasingUnlearner

_SCOPES = ("all", "current")
#: the sensitivities of a calibrated release: the contraction one when its inputs are given ("auto"), or either
BOUNDS = ("auto", "contraction", "paper")
_DIRECTIONS = ("model_to_target", "target_to_model")


class SAFEUnlearner(ReleasingUnlearner):
    """SAFE streaming unlearning ([SAFE] Algorithm 1): each forget request is one round ``t``, and the model becomes
    one normalised step from the anchor ``w_0``: ``w_t = w_0 - gamma g_t/||g_t|| - b_t``.

    Reads the samples to forget (``data`` of :meth:`forget`) and the :class:`SAFERecorder`'s statistics, never
    the retained data. The step starts at ``w_0`` every round, with module buffers (BatchNorm) reset to their ``w_0``
    values; the module's outputs must be class logits. Uncertified by default (Theorem 2 bounds the expected dynamic
    regret, not the distance to retraining); with ``release=ReleaseConfig(epsilon=, delta=)`` the noise ``b_t`` is
    calibrated for an (epsilon, delta) certificate on the sensitivity ``2W`` or, [derived], the contraction bound
    ``D_T + gamma``. Per-round quantities are in ``result.extra``.
    Derivation, certificate and ``result.extra``: docs/methods/safe.md.

    Args:
        module: the trained module (its weights are overwritten with ``w_t``).
        recorder: the :class:`SAFERecorder` that watched the fit.
        forget_weight: ``lambda`` of Eq. (10)/(25); default 1000 (Sec. 4.1, MNIST).
        lr_constant: ``K`` of Theorem 2's ``gamma = sqrt(W)/(K sqrt(T))``, ``W = ||w_0||_2``; default 2.5.
        expected_rounds: the horizon ``T`` (default 20, as in the paper); after more rounds ``T = t``.
        step_size: ``gamma`` directly (overrides ``lr_constant`` and ``expected_rounds``).
        forget_scope: ``"all"`` (default: ``F_1..F_t``, Eq. (25); ``data`` must hold the earlier rounds' samples
            too) or ``"current"`` (``F_t``, Alg. 1 line 8).
        kl_direction: ``"model_to_target"`` (default, ``KL(f(x;w) || target)``, [interp]) or ``"target_to_model"``.
        release: noise, calibration and accounting (:class:`~lightning_unlearn.privacy.ReleaseConfig`); default
            ``ReleaseConfig(epsilon=None, delta=None)``: no noise (or the fixed ``sigma_override``), uncertified.
        weight_bound: ``W``, an assumed bound on every model's ``||w||_2`` (constants ``"given"``); default
            ``||w_0||_2``, estimated, so the certificate is not certified.
        ledger: where executed requests are recorded (default: a new in-memory :class:`Ledger`).
        constants: the model's Assumption 1 constants (e.g.
            :func:`~lightning_unlearn.functional.bounds.module_constants`), for the contraction sensitivity.
        trajectory: the :class:`TrajectoryRecorder` that watched the same SGD fits, for the contraction sensitivity.
        bound: ``"auto"`` (default: ``"contraction"`` when ``constants`` and ``trajectory`` are given, else
            ``"paper"``), ``"contraction"`` (``D_T + gamma``) or ``"paper"`` (Theorem 2(iii)'s ``2W``).

    Raises:
        TypeError: If ``recorder`` is not a :class:`SAFERecorder` or ``release`` not a ``ReleaseConfig``.
        ValueError: If ``forget_weight < 0``, ``lr_constant <= 0``, ``expected_rounds < 1``, ``step_size <= 0``,
            ``weight_bound <= 0``, ``bound``, ``forget_scope`` or ``kl_direction`` is unknown, or
            ``bound="contraction"`` lacks ``constants`` or ``trajectory``.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import ForgetRequest, IndexedDataset
        >>> from lightning_unlearn.callbacks import SAFERecorder
        >>> from lightning_unlearn.models import SupervisedClassifier
        >>> _ = torch.manual_seed(0)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.arange(32) % 2))
        >>> model = SupervisedClassifier(nn.Linear(4, 2), lr=0.1)
        >>> recorder = SAFERecorder(num_classes=2, proj_dim=2)
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> result = SAFEUnlearner(model, recorder).forget(ForgetRequest.samples([0, 1]), data)
        >>> result.extra["round"], result.extra["n_retained"], result.certificate.certified
        (1, 30, False)
    """

    method = "safe"
    method_info = MethodInfo(
        guarantee="none by default ([SAFE] Thm. 2 bounds regret); (epsilon, delta) with epsilon, delta, weight_bound",
        assumptions="one request per round; the certified release needs the weight bound W (Thm. 2(iii))",
        cost="one step from the anchor w_0 per request: gradients of the forget buffer at w_0",
        paper="SAFE",
    )
    reads_data = True
    needs_forget_data = True
    default_release = ReleaseConfig(epsilon=None, delta=None)

    def __init__(
        self,
        module: nn.Module,
        recorder: SAFERecorder,
        *,
        forget_weight: float = 1000.0,
        lr_constant: float = 2.5,
        expected_rounds: int = 20,
        step_size: float | None = None,
        forget_scope: str = "all",
        kl_direction: str = "model_to_target",
        release: ReleaseConfig | None = None,
        weight_bound: float | None = None,
        ledger: Ledger | None = None,
        constants: ModelConstants | None = None,
        trajectory: TrajectoryRecorder | None = None,
        bound: str = "auto",
    ) -> None:
        if not isinstance(recorder, SAFERecorder):
            raise TypeError(f"SAFEUnlearner needs a SAFERecorder, got {type(recorder).__name__}")
        if forget_weight < 0 or lr_constant <= 0 or expected_rounds < 1 or (step_size is not None and step_size <= 0):
            raise ValueError(
                "SAFEUnlearner needs forget_weight >= 0, lr_constant > 0, expected_rounds >= 1, step_size > 0; "
                f"got {forget_weight}, {lr_constant}, {expected_rounds}, {step_size}"
            )
        if weight_bound is not None and not weight_bound > 0:
            raise ValueError(f"SAFEUnlearner weight_bound W must be positive, got {weight_bound}")
        if bound not in BOUNDS:
            raise ValueError(f"SAFEUnlearner bound must be one of {BOUNDS}, got {bound!r}")
        if bound == "contraction" and (constants is None or trajectory is None):
            raise ValueError(
                "SAFEUnlearner bound='contraction' needs constants= (Assumption 1) and trajectory= (the "
                "TrajectoryRecorder of the same SGD fits)"
            )
        if forget_scope not in _SCOPES or kl_direction not in _DIRECTIONS:
            raise ValueError(
                f"forget_scope must be one of {_SCOPES} and kl_direction one of {_DIRECTIONS}; got {forget_scope!r}, "
                f"{kl_direction!r}"
            )
        super().__init__(module, recorder, ledger, release=release)
        self.recorder: SAFERecorder = recorder
        self.forget_weight, self.lr_constant, self.expected_rounds = (
            float(forget_weight),
            float(lr_constant),
            int(expected_rounds),
        )
        self.fixed_step = None if step_size is None else float(step_size)
        self.forget_scope, self.kl_direction = forget_scope, kl_direction
        self.weight_bound = weight_bound
        self.model_constants, self.trajectory = constants, trajectory
        self.bound = (
            bound if bound != "auto" else "contraction" if constants is not None and trajectory is not None else "paper"
        )

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        anchor = rec.require_anchor()
        x, labels = self.forget_samples(ids, data)
        x = self._checked_inputs(x)
        self._check_module()
        names, device = rec.param_names, next(self.module.parameters()).device
        x, labels = x.to(device), labels.to(device)
        w0 = {n: t.to(device) for n, t in anchor.w0.items()}
        buffers = {n: t.to(device) for n, t in rec.buffers0.items()}
        V = anchor.V.to(device)
        t = rec.rounds + 1

        # Eq. (15): retention gradient (and risk) at w_0 over D_t = D_{t-1} \ F_t, with the module's own loss
        with eval_mode(self.module):
            g_f, loss_f = safe.summed_loss_grad(self.module, w0, buffers, x, labels, rec.loss_fn)
        grad_sum = {n: rec.grad_sum[n].to(device) - g_f[n].detach().double() for n in names}
        loss_sum = rec.loss_sum.to(device) - loss_f.double()
        n_t = rec.n_retained - int(ids.numel())
        if n_t < 1:
            raise ValueError(
                f"{self.method}: the request would leave no retained sample; SAFE's retention term (Eq. (14)) is "
                "undefined"
            )
        g_ret = safe.flatten(grad_sum, names) / n_t

        # Eq. (22)-(24): class statistics of D_t and the pseudo-targets of the forget buffer
        u_new = safe.project(x, V)
        dn, ds1, ds2 = safe.class_sums(u_new, labels, rec.num_classes)
        counts = rec.counts.to(device) - dn
        moments_t = rec.moments(counts, rec.s1.to(device) - ds1, rec.s2.to(device) - ds2)
        moments_0 = (anchor.ref_mean.to(device), anchor.ref_cov.to(device))
        ref_counts = anchor.ref_counts.to(device)
        bx, by = self._scope(x, labels, data)
        log_q = safe.log_shift_ratio(safe.project(bx, V), counts, ref_counts, moments_t, moments_0)
        with eval_mode(self.module), torch.no_grad():
            logits_0 = torch.func.functional_call(self.module, {**w0, **buffers}, (bx,))
        self._check_outputs(logits_0, len(bx))
        target = safe.pseudo_target(logits_0.double(), log_q)

        # Eq. (25)-(27): forgetting gradient at w_0, total gradient, one normalised step from w_0
        with eval_mode(self.module):
            g_fg_d, fg_w0 = safe.forgetting_grad(
                self.module, w0, buffers, bx, target, self.forget_weight, self.kl_direction
            )
        g_fg = safe.flatten(g_fg_d, names)
        g = g_ret + g_fg
        if not bool(torch.isfinite(g).all()):
            raise ValueError(
                f"{self.method}: the round's gradient is not finite; check the forget data and the recorded statistics"
            )
        step = (
            self.fixed_step
            if self.fixed_step is not None
            else safe.step_size(
                float(safe.flatten(anchor.w0, names).norm()), self.lr_constant, max(t, self.expected_rounds)
            )
        )
        flat0 = safe.flatten(w0, names)
        W = self.weight_bound if self.weight_bound is not None else float(flat0.norm())
        published, sensitivity = None, {"sensitivity": 2 * W}
        if self.release.epsilon is not None:  # Theorem 2(iii), or the contraction bound: -b_t ~ N(0, sigma^2 I)
            sensitivity = self._sensitivity(ids, W, step)
            internal = safe.normalised_step(flat0, g, step, torch.zeros_like(flat0))
            published = self._release(sensitivity["sensitivity"], internal)
            flat_t = published.weights
        else:
            std = self.release.noise_std(0.0)  # without a target: sigma_override, or 0
            noise = (
                gaussian_noise(flat0.shape, std, torch.float64, self.release.seed, t).to(device)
                if std
                else torch.zeros_like(flat0)
            )
            flat_t = safe.normalised_step(flat0, g, step, noise)
        w_t = safe.unflatten(flat_t, anchor.w0, names)

        with eval_mode(self.module), torch.no_grad():
            logits_t = torch.func.functional_call(self.module, {**w_t, **buffers}, (bx,))
            fg_t = float(self.forget_weight * safe.kl_to_target(logits_t.double(), target, self.kl_direction).mean())
        retain_risk_w0 = float(loss_sum) / n_t
        surrogate = retain_risk_w0 + float(g_ret @ (flat_t - flat0)) + fg_t
        n_forgotten = int(rec.forget_ids.numel() + ids.numel())
        own_ratio = safe.log_density_ratio(u_new, moments_t, moments_0).gather(1, labels[:, None]).mean()
        extra = {
            "round": t,
            "n_forget_round": int(ids.numel()),
            "n_forgotten_total": n_forgotten,
            "n_retained": n_t,
            "step_size": step,
            "grad_norm_retain": float(g_ret.norm()),
            "grad_norm_forget": float(g_fg.norm()),
            "cos_retain_forget": float(torch.nn.functional.cosine_similarity(g_ret, g_fg, dim=0)),
            "step_norm": float((flat_t - flat0).norm()),
            "retain_risk_w0": retain_risk_w0,
            "forget_risk_w0": float(fg_w0),
            "forget_risk": fg_t,
            "surrogate_risk": surrogate,
            "cumulative_surrogate_risk": rec.cumulative_surrogate + surrogate,
            "theorem1_bound": safe.theorem1_bound(rec.num_classes, n_forgotten, n_t),
            "label_shift": ((counts / ref_counts.clamp(min=1)) * rec.n_anchor / n_t).tolist(),
            "mean_log_density_ratio": float(own_ratio),
        }

        weights = {**w_t, **rec.buffers0}
        change = rec.round_change(x, labels, ids, grad_sum, loss_sum, surrogate)
        state = {} if published is None else published.state
        return UnlearningUpdate(
            self._certificate(published, W, sensitivity), weights=weights, statistics=change, state=state, extra=extra
        )

    def _sensitivity(self, ids: Tensor, weight_bound: float, step: float) -> dict[str, float]:
        """The release's L2 sensitivity and its terms: Theorem 2(iii)'s ``2W``, or [derived] ``D_T + gamma``
        (:meth:`contraction_problems` refuses a certified release whose assumptions fail)."""
        if self.bound == "paper":
            return {"sensitivity": 2 * weight_bound}
        traj, c = self._contraction_inputs()
        problems = self.contraction_problems(traj, c)
        if problems and self.release.calibrated:
            raise ReleaseRefused(f"{self.method} refuses a certified release: {'; '.join(problems)}")
        forgotten = torch.cat([self.recorder.forget_ids, ids.cpu()]).tolist()
        untracked = [i for i in forgotten if i not in traj.row_of]
        if untracked:
            raise ValueError(
                f"{self.method}'s contraction bound needs the batches of every forgotten sample: ids {untracked[:10]} "
                "were not tracked by the trajectory recorder"
            )
        mask = torch.zeros(traj.n_rows, dtype=torch.bool)
        mask[torch.tensor([traj.row_of[i] for i in forgotten], dtype=torch.long)] = True
        occ_rows, occ_steps = traj.occurrences()
        removed = torch.bincount(occ_steps[mask[occ_rows]], minlength=traj.n_steps)
        lrs = torch.tensor(traj.lrs, dtype=torch.float64)
        divergence = sgd_bound(lrs, torch.tensor(traj.batch_sizes), removed, c).divergence
        return {"sensitivity": divergence + step, "divergence": divergence, "step_size": step}

    def _contraction_inputs(self) -> tuple[TrajectoryRecorder, ModelConstants]:
        if self.trajectory is None or self.model_constants is None:
            raise ValueError(f"{self.method}: the contraction bound needs constants= and trajectory=")
        return self.trajectory, self.model_constants

    def contraction_problems(self, traj: TrajectoryRecorder, c: ModelConstants) -> list[str]:
        """Why the contraction bound's assumptions fail (empty: they hold): the trajectory is the fit SAFE anchors
        on (the same learned samples), every step size meets ``2/(M + lambda)`` and the observed gradients ``G``."""
        problems = []
        if set(traj.catalog.ids.tolist()) != set(self.recorder.catalog.ids.tolist()):
            problems.append("the trajectory recorder did not watch the same fits as the SAFERecorder")
        condition = contraction_condition(torch.tensor(traj.lrs, dtype=torch.float64), c)
        if condition is not None:
            problems.append(condition)
        if traj.grad_max > c.grad_bound * (1 + 1e-6):
            problems.append(f"observed per-sample gradient norm {traj.grad_max:.4g} > G = {c.grad_bound:.4g}")
        return problems

    def _assumptions(self, weight_bound: float) -> list[str]:
        step = "given (step_size)" if self.fixed_step is not None else "sqrt(||w_0||)/(K sqrt(T)): data-dependent"
        if self.bound == "paper":
            kind = "given" if self.weight_bound is not None else "ESTIMATED as ||w_0|| (not a proof)"
            return [
                f"every model within ||w|| <= W = {weight_bound:.4g} ({kind}): Theorem 2(iii), sensitivity 2W",
                "retrain compared with: any model in that ball",
            ]
        traj, c = self._contraction_inputs()
        problems = self.contraction_problems(traj, c)
        lines = [c.describe()] + [f"FAILS: {p}" for p in problems]
        if not problems:
            lines.append(
                f"checked: the trajectory recorder watched the same fits; every step size <= 2/(M + lambda) = "
                f"{c.max_lr:.4g}; observed gradients {traj.grad_max:.4g} <= G"
            )
        return lines + [
            "bound: contraction [derived] (docs/certificates.md), D_T + gamma (the step moves w_0 by gamma)",
            f"step size gamma {step}",
            "retrain compared with: the SGD recipe with the same batches, the forgotten samples left out, each step "
            "still divided by the original batch size ([HF] Eq. (5))",
            "exact arithmetic: rounding is not in the bound",
        ]

    def _certificate(
        self, published: Publication | None, weight_bound: float, sensitivity: dict[str, float]
    ) -> Certificate:
        if published is None:
            std = self.release.noise_std(0.0)  # without a target: sigma_override, or 0
            note = f"; fixed noise std {std:g}" if std else ""
            return Certificate(
                method=self.method,
                exact=False,
                sigma=std or None,  # noise without a certificate is labelled as such, with its std
                statement=(
                    f"SAFE ([SAFE] Alg. 1): heuristic{note}; Thm 2 bounds expected dynamic regret, "
                    "not distance to retraining"
                ),
            )
        assumptions = self._assumptions(weight_bound)
        if self.bound == "paper":
            kind = "estimated" if self.weight_bound is None else "given"
            return Certificate(
                method=self.method,
                exact=False,
                **published.certificate_fields(),
                bounds={
                    "W": weight_bound,
                    "sensitivity": 2 * weight_bound,
                    "sigma_classical_theorem2": published.plan.sigma_classical / 2,
                },
                statement=(
                    "SAFE ([SAFE] Thm 2(iii)): analytic Gaussian noise on sensitivity 2W, assuming ||w||_2 <= W "
                    f"({kind} W)" + self.release.uncertified_note
                ),
                constants=kind,
                assumptions=assumptions,
            )
        _, c = self._contraction_inputs()
        return Certificate(
            method=self.method,
            exact=False,
            **published.certificate_fields(),
            bounds={**sensitivity, "W": weight_bound, **published.sigma_bounds},
            statement=(
                "SAFE ([SAFE] Alg. 1) + contraction bound [derived]: ||w_retrain - (w_0 - gamma g/||g||)|| <= D_T + "
                f"gamma ({c.kind} constants), analytic Gaussian mechanism" + self.release.uncertified_note
            ),
            constants=c.kind,
            recipe="unchecked" if any(a.startswith("FAILS") for a in assumptions) else "checked",
            assumptions=assumptions,
        )

    def _scope(self, x: Tensor, y: Tensor, data: ForgetData) -> tuple[Tensor, Tensor]:
        """The samples the forgetting term sums over: ``F_1..F_t`` (Eq. (25)) or ``F_t`` (Alg. 1 line 8).

        The library keeps no forgotten input, so Eq. (25)'s earlier rounds ``F_1..F_{t-1}`` are read
        again from ``data`` (by the ids the recorder kept); ``ValueError`` if ``data`` lacks them.
        """
        earlier = self.recorder.forget_ids
        if self.forget_scope == "current" or not earlier.numel():
            return x, y
        try:
            ex, _ = select_by_ids(data, earlier, keys=self.recorder.batch_keys)  # type: ignore[arg-type]
        except ValueError as err:
            raise ValueError(
                f"{self.method} with forget_scope='all' (Eq. (25)) sums over every earlier round's samples, which the "
                f"library does not keep: pass them in data too, or use forget_scope='current' ({err})"
            ) from None
        earlier_x, earlier_y = self._checked_inputs(ex).to(x.device), self.catalog.labels_of(earlier).to(y.device)
        return torch.cat([x, earlier_x]), torch.cat([y, earlier_y])

    def _checked_inputs(self, x: Tensor) -> Tensor:
        V = self.recorder.require_anchor().V
        if x[0].numel() != V.shape[0]:
            raise ValueError(
                f"forget data has {x[0].numel()} features per sample but the recorded projection expects {V.shape[0]}"
            )
        return x.detach()

    def _check_outputs(self, outputs: Tensor, n: int) -> None:
        """``ValueError`` unless the module's outputs are ``(n, num_classes)`` class logits: the forgetting term
        (Eq. (8), (24)-(25)) compares predictive distributions ``softmax(f(x; w))``, whatever the loss."""
        C = self.recorder.num_classes
        if not isinstance(outputs, Tensor) or tuple(outputs.shape) != (n, C):
            shape = tuple(outputs.shape) if isinstance(outputs, Tensor) else type(outputs).__name__
            raise ValueError(
                f"{self.method} needs the module's outputs to be class logits of shape ({n}, {C}) (its forgetting "
                f"term is a KL between softmax predictive distributions, Eq. (25)); got {shape}"
            )

    def _check_module(self) -> None:
        rec = self.recorder
        params = {n: p for n, p in self.module.named_parameters() if p.requires_grad}
        shapes = {n: tuple(p.shape) for n, p in params.items()}
        recorded = {n: tuple(t.shape) for n, t in rec.require_anchor().w0.items()}
        if shapes != recorded:
            diff = sorted(set(shapes.items()) ^ set(recorded.items()))[:5]
            raise ValueError(f"the module's trainable parameters do not match the recorded w_0 (differences: {diff})")
        if set(dict(self.module.named_buffers())) != set(rec.buffers0):
            raise ValueError("the module's buffers do not match the recorded ones")
