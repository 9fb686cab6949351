"""Closed-form constants of Assumption 1 ([HF]) / Assumption 2.1 ([CCL]) for linear softmax and logistic models,
and the contraction-based sensitivities built on them (``docs/certificates.md``).

For a linear model ``z = W phi + b`` on fixed features ``phi`` (a frozen backbone, or the raw
inputs) and the per-sample loss ``l(theta; x, y) = CE(z, y) + (l2/2)||theta||^2`` over all trainable
parameters ``theta = (W, b)``, with ``x~ = (phi, 1)`` (or ``phi`` without a bias) [derived]:

* Hessian: ``(diag(p) - p p^T) (x) x~ x~^T + l2 I``. ``lambda_max(diag(p) - p p^T) <= 1/2`` for any
  probability vector p (and ``p(1 - p) <= 1/4`` for a single sigmoid output), so every per-sample
  Hessian lies between ``l2 I`` and ``M I`` with ``M = ||x~||^2/2 + l2`` (``||x~||^2/4 + l2``), at
  every ``theta``: M is the per-sample smoothness of Assumption 1, not the batch Hessian's norm.
* Gradient of the cross-entropy: ``(p - e_y) (x) x~``, norm ``<= sqrt(2) ||x~||`` (``||x~||`` for a
  sigmoid), the loss' Lipschitz constant ``L_CE``.
* Parameter norm along training: a gradient step on ``mean CE + (l2/2)||theta||^2`` with
  ``eta l2 <= 1`` maps the ball ``||theta|| <= Theta = max(||theta_0||, L_CE/l2)`` into itself
  (``||theta'|| <= (1 - eta l2) Theta + eta L_CE``), and so does the exact minimiser of a task
  objective with a proximal term anchored in the ball. Hence the per-sample gradient, including the
  regulariser, is bounded by ``G = L_CE + l2 Theta`` at every iterate: Lemma 2's G ([HF]) and
  Assumption 2.1's L ([CCL]).

* The cross-entropy's gradient alone (without the ridge) is bounded by ``L_CE`` at EVERY ``theta``
  (``loss_lipschitz``), and its Hessian in ``theta`` is Lipschitz with constant ``K = c ||x~||^3``
  (:func:`~lightning_unlearn.functional.newton.hessian_lipschitz_bound`, ``hessian_lipschitz``).

The bounds hold for every sample whose feature norm is at most the ``feature_norm`` given: compute
it over all the data the model learns (:func:`max_feature_norm`). That maximum includes the samples
that may later be forgotten, so the constants (and a noise calibrated on them) depend on the data
unless ``feature_norm`` is a public bound (e.g. the input range): every certificate lists it.

Contraction-based sensitivities [derived] (``docs/certificates.md`` gives the proofs and their
assumptions): :func:`sgd_bound` for [HF]'s vector update (and the distance an SGD trajectory moves
when samples are removed, used by [SAFE]), :func:`forgetting_chain` and :func:`newton_chain` for
[CCL]'s natural-forgetting and Hessian-based updates on a chain of proximal tasks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_unlearn.functional.newton import hessian_lipschitz_bound

KINDS = ("bounded", "given", "estimated")


@dataclass(frozen=True)
class ModelConstants:
    """Assumption 1 constants and where they come from.

    Args:
        smoothness: M, an upper bound on every per-sample Hessian's largest eigenvalue.
        grad_bound: G, an upper bound on every per-sample gradient norm along training (also the
            Lipschitz constant L of [CCL]).
        strong_convexity: lambda (mu in [CCL]), a lower bound on every per-sample Hessian's eigenvalues.
        kind: ``"bounded"`` (proved from the model and data, e.g. :func:`linear_model_constants`),
            ``"given"`` (asserted by the caller) or ``"estimated"`` (observed maxima: not a proof;
            a certificate built on them is not certified).
        loss_lipschitz: ``L_CE``, a bound on the per-sample gradient of the data term alone (the loss
            without the ridge) at every parameter, or ``None`` (then ``grad_bound`` stands for it).
        param_bound: ``Theta``, the radius of the ball ``||theta|| <= Theta`` on which ``grad_bound``
            holds (``None``: asserted everywhere).
        hessian_lipschitz: ``K``, a Lipschitz constant of the per-sample Hessian (``None``: unknown; the
            contraction bounds then use their first-order forms only).
    """

    smoothness: float
    grad_bound: float
    strong_convexity: float
    kind: str = "bounded"
    loss_lipschitz: float | None = None
    param_bound: float | None = None
    hessian_lipschitz: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ModelConstants kind must be one of {KINDS}, got {self.kind!r}")
        if not (self.smoothness >= self.strong_convexity >= 0 and self.grad_bound >= 0):
            raise ValueError(f"need smoothness >= strong_convexity >= 0 and grad_bound >= 0, got {self}")
        optional = (self.loss_lipschitz, self.param_bound, self.hessian_lipschitz)
        if any(v is not None and not v >= 0 for v in optional):
            raise ValueError(f"loss_lipschitz, param_bound and hessian_lipschitz must be >= 0 (or None), got {self}")

    @property
    def data_lipschitz(self) -> float:
        """The bound on a per-sample gradient of the data term: ``loss_lipschitz``, else ``grad_bound``."""
        return self.grad_bound if self.loss_lipschitz is None else self.loss_lipschitz

    def describe(self) -> str:
        """One line for a certificate's assumptions: the constants, their values and where they come from."""
        values = f"M = {self.smoothness:.4g}, G = {self.grad_bound:.4g}, lambda = {self.strong_convexity:.4g}"
        if self.hessian_lipschitz is not None:
            values += f", K = {self.hessian_lipschitz:.4g}"
        if self.kind == "bounded":
            return (
                f"constants bounded ({values}): closed form over the largest feature norm of the learned data "
                "(forgotten samples included: data-dependent unless that norm is a public bound)"
            )
        if self.kind == "given":
            return f"constants given by the caller ({values}): asserted, not checked"
        return f"constants ESTIMATED from observed maxima along training ({values}): not a proof"

    @property
    def max_lr(self) -> float:
        """``2/(M + lambda)``: the largest step size with contraction ``rho < 1`` (Lemma 3, Theorem 6 of [HF])."""
        return 2.0 / (self.smoothness + self.strong_convexity)


def linear_model_constants(
    feature_norm: float, l2: float, *, init_norm: float = 0.0, bias: bool = True, binary: bool = False
) -> ModelConstants:
    """Closed-form M, G and lambda of L2-regularised softmax (or, ``binary``, sigmoid) regression (module docstring).

    Args:
        feature_norm: ``max ||phi(x)||`` over the data the model learns.
        l2: the ridge coefficient (> 0: strong convexity).
        init_norm: ``||theta_0||`` of the initial parameters (for [CCL]'s first anchor ``w_0 = 0``, 0).
        bias: whether the linear layer has a bias (which adds 1 to ``||x~||^2``).
        binary: one sigmoid output instead of a softmax.

    Raises:
        ValueError: ``l2 <= 0`` (no strong convexity, no finite parameter bound) or negative norms.
    """
    if not l2 > 0:
        raise ValueError(f"closed-form constants need a positive ridge l2 (strong convexity), got {l2}")
    if feature_norm < 0 or init_norm < 0:
        raise ValueError(f"norms must be >= 0, got feature_norm={feature_norm}, init_norm={init_norm}")
    r2 = feature_norm**2 + (1.0 if bias else 0.0)
    curvature, lipschitz = (r2 / 4, math.sqrt(r2)) if binary else (r2 / 2, math.sqrt(2 * r2))
    lipschitz = round_up(lipschitz)
    theta = max(init_norm, round_up(lipschitz / l2))
    return ModelConstants(
        smoothness=round_up(curvature + l2),  # attained: a sigmoid's Hessian at z = 0 is exactly r2/4 + l2
        grad_bound=round_up(lipschitz + l2 * theta),
        strong_convexity=l2,
        kind="bounded",
        loss_lipschitz=lipschitz,
        param_bound=theta,
        hessian_lipschitz=hessian_lipschitz_bound(feature_norm, bias=bias, binary=binary),
    )


def linear_head(module: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """Split a model (or its ``.net``) into its frozen feature map and its only trainable layer, a final ``nn.Linear``
    (a bare ``nn.Linear`` has the identity as feature map).

    Raises:
        ValueError: the trainable parameters are not exactly those of one final ``nn.Linear``.
    """
    trainable = [m for m in module.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    seq = getattr(module, "net", module)
    if isinstance(seq, nn.Linear) and trainable == [seq]:
        return nn.Identity(), seq
    if (
        len(trainable) != 1
        or not isinstance(trainable[0], nn.Linear)
        or not isinstance(seq, nn.Sequential)
        or seq[-1] is not trainable[0]
    ):
        raise ValueError(
            "closed-form constants need a linear model: an nn.Sequential (or a module whose .net is one) whose only "
            f"trainable layer is its last, an nn.Linear; got trainable layers {[type(m).__name__ for m in trainable]}"
        )
    return seq[:-1], trainable[0]


def round_up(bound: float, operations: int = 4) -> float:
    """``bound`` raised past the rounding of the ``operations`` float64 operations that computed it (each off by at
    most half an ulp, relative ``2^-53``): a bound the data can attain stays an upper bound once computed."""
    return bound * (1 + (operations + 1) * _EPS64)


_EPS64 = torch.finfo(torch.float64).eps  # 2^-52, as functional/convex.py spells it


@torch.no_grad()
def max_feature_norm(features: nn.Module, inputs: Iterable[Tensor]) -> float:
    """``max ||features(x)||`` over the batches of inputs ``inputs`` (float64; the feature map in eval mode), raised
    past the rounding of a float64 norm of ``p`` features (:func:`round_up` of ``p + 2`` operations)."""
    was_training, best, width = features.training, 0.0, 0
    features.eval()
    try:
        for x in inputs:
            phi = features(x).reshape(len(x), -1).double()
            if len(phi):
                best, width = max(best, float(phi.norm(dim=1).max())), phi.shape[1]
    finally:
        features.train(was_training)
    return round_up(best, width + 2)


def module_constants(
    module: nn.Module, inputs: Iterable[Tensor], l2: float | None = None, binary: bool = False
) -> ModelConstants:
    """:func:`linear_model_constants` of a linear model (:func:`linear_head`) over the inputs it will learn.

    Call it before training: ``||theta_0||`` is read from the module's current parameters.
    ``l2`` defaults to the module's ``l2`` attribute.
    """
    features, head = linear_head(module)
    l2 = float(getattr(module, "l2", 0.0)) if l2 is None else l2
    init = math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in head.parameters()))
    return linear_model_constants(
        max_feature_norm(features, inputs), l2, init_norm=init, bias=head.bias is not None, binary=binary
    )


# -- contraction-based sensitivities [derived] (docs/certificates.md) -----------------------------------------------
def contraction_condition(lrs: Tensor, c: ModelConstants) -> str | None:
    """``None`` if every step size satisfies ``eta_t <= 2/(M + lambda)`` with ``lambda > 0`` (the gradient step of a
    lambda-strongly convex, M-smooth objective is then a contraction with factor ``1 - eta_t lambda``), else why not,
    naming the recipe that would satisfy it."""
    lam, M = c.strong_convexity, c.smoothness
    if not lam > 0:
        return f"strong convexity lambda = {lam:g} (the ridge l2) must be positive: train with weight_decay > 0"
    lr = float(lrs.max()) if lrs.numel() else 0.0
    if lr > c.max_lr:
        return (
            f"step size lr = {lr:.4g} exceeds 2/(M + lambda) = {c.max_lr:.4g} (M = {M:.4g}, lambda = {lam:.4g}), so "
            f"the SGD step is not a contraction; a recipe with lr <= {c.max_lr:.4g} (e.g. lr = {0.9 * c.max_lr:.4g}) "
            "satisfies it"
        )
    return None


@dataclass(frozen=True)
class SGDBound:
    """The contraction bounds of one SGD trajectory for a set ``U`` of removed samples (:func:`sgd_bound`).

    Args:
        divergence: ``D_T``, a bound on ``||w_T^{-U} - w_T||``: the trajectory retrained without ``U`` (same
            initialisation and batches, ``U``'s samples left out, each step still divided by ``|B_t|``: [HF]
            Eq. (5)) against the learned one.
        approximation: ``A_T``, a bound on ``||a_T^{-U}||``, [HF]'s summed vectors (Eq. (10)).
        second_order: ``E_T``, a bound on ``||w_T^{-U} - w_T - a_T^{-U}||`` from the error recursion (first order
            without a Hessian-Lipschitz constant, second order with one).
    """

    divergence: float
    approximation: float
    second_order: float

    @property
    def triangle(self) -> float:
        """``D_T + A_T >= ||w_T^{-U} - (w_T + a_T^{-U})||`` by the triangle inequality."""
        return self.divergence + self.approximation

    @property
    def sensitivity(self) -> float:
        """The smaller of the two valid bounds on [HF]'s approximation error: ``min(D_T + A_T, E_T)``."""
        return min(self.triangle, self.second_order)


def _prefix(log_factor: Tensor, log_add: Tensor) -> Tensor:
    """``X_t`` for ``t = 0..T`` of ``X_{t+1} = f_t X_t + b_t``, ``X_0 = 0``, from ``log f`` and ``log b``
    (``logcumsumexp``: no product over a long trajectory under- or overflows)."""
    cum = torch.cumsum(log_factor, 0)  # sum_{q <= t} log f_q
    before = torch.cat([cum.new_zeros(1), cum])  # sum_{q < t} log f_q, t = 0..T
    # X_t = sum_{s < t} b_s exp(cum_{t-1} - cum_s)
    acc = torch.logcumsumexp(log_add - cum, 0)
    log_x = torch.cat([cum.new_full((1,), -math.inf), before[1:] + acc])
    return torch.exp(log_x)


def sgd_bound(
    lrs: Tensor, batch_sizes: Tensor, removed: Tensor, c: ModelConstants, *, released_before: bool = False
) -> SGDBound:
    """[derived] Contraction bounds on an SGD trajectory with ``removed[t]`` of step ``t``'s ``batch_sizes[t]`` samples
    left out (``docs/certificates.md``, section HF).

    Per step, with ``r_t`` removed samples, ``k_t = |B_t| - r_t`` kept, the learned step
    ``w - (eta_t/|B_t|) sum_{B_t} grad l`` and the retrained step ``w - (eta_t/|B_t|) sum_{B_t minus U} grad l``
    ([HF] Eq. (5)) differ by at most ``b_t = eta_t r_t G / |B_t|`` at the learned iterate, and the retrained step is
    ``f_t``-Lipschitz with ``f_t = max(|1 - eta_t lambda k_t/|B_t||, |1 - eta_t M k_t/|B_t||)`` (its objective is
    ``(k_t/|B_t|) lambda``-strongly convex and ``(k_t/|B_t|) M``-smooth); [HF]'s recursion matrix ``I - eta_t H_t``
    has norm ``<= max(|1 - eta_t lambda|, |1 - eta_t M|) <= f_t``. Hence
    ``D_{t+1} <= f_t D_t + b_t`` and ``A_{t+1} <= f_t A_t + b_t``. With ``eta_t <= 2/(M + lambda)``,
    ``f_t = 1 - eta_t lambda k_t/|B_t|`` (a contraction). The error ``e_t = w_t^{-U} - w_t - a_t`` obeys
    ``e_{t+1} = (I - eta_t Hbar_t') e_t + eta_t (H_t - Hbar_t') a_t`` exactly (the injections cancel), ``Hbar_t'`` the
    retained step's Hessian averaged between the two iterates, so
    ``E_{t+1} <= f_t E_t + eta_t c_t A_t`` with
    ``c_t = min(M - lambda k_t/|B_t|, (r_t M + k_t K Dtil_t / 2) / |B_t|)`` (``K`` the Hessian-Lipschitz constant;
    the second form only when it is known), ``Dtil_t`` a bound on ``||w_t^{-U} - w_t||``: ``D_t``, or ``D_t + A_t``
    when ``released_before`` (training continued from a model published after earlier deletions: the learned
    trajectory then jumped by the deleted vectors, which ``A_t`` covers).

    ``A`` uses the retained step's ``f_t`` too, so ``D_T + A_T`` does not depend on when each sample was deleted
    (a jump at a release moves a vector's bound from ``A`` to ``D`` unchanged).

    Args:
        lrs, batch_sizes, removed: per step (float64 or int tensors of length ``T``).
        c: Assumption 1's constants (``G`` must bound the removed samples' gradients at the learned iterates).
        released_before: see above.
    """
    eta = lrs.double()
    size = batch_sizes.double()
    r = removed.double()
    if not (eta.shape == size.shape == r.shape) or bool((r > size).any()) or bool((r < 0).any()):
        raise ValueError("sgd_bound needs lrs, batch_sizes and removed of one length with 0 <= removed <= batch size")
    lam, M, G = c.strong_convexity, c.smoothness, c.grad_bound
    kept = (size - r) / size
    f_retained = torch.maximum((1 - eta * lam * kept).abs(), (1 - eta * M * kept).abs())
    f_learned = torch.maximum((1 - eta * lam).abs(), (1 - eta * M).abs())
    log_f = torch.maximum(f_retained, f_learned).clamp_min(1e-300).log()
    log_b = torch.log(eta * r * G / size)
    X = _prefix(log_f, log_b)  # D_t = A_t bound, t = 0..T
    first = (M - lam * kept).clamp_min(0.0)
    if c.hessian_lipschitz is None:
        coef = first
    else:
        dtil = X[:-1] * (2.0 if released_before else 1.0)
        coef = torch.minimum(first, (r * M + (size - r) * c.hessian_lipschitz * dtil / 2) / size)
    log_fe = f_retained.clamp_min(1e-300).log()
    E = _prefix(log_fe, torch.log(eta * coef * X[:-1]))
    return SGDBound(divergence=float(X[-1]), approximation=float(X[-1]), second_order=float(E[-1]))


def forgetting_chain(
    sizes: Sequence[int],
    removed: Sequence[int],
    gaps: Sequence[float],
    c: ModelConstants,
    reg_lambda: float,
    tolerance: float,
) -> list[float]:
    """[derived] ``D_i``, a bound on ``||w_i^R - end_i||`` after each task of a [CCL] proximal chain.

    Task ``i`` (``sizes[i]`` samples, ``removed[i]`` of them forgotten) was solved from the anchor ``start_i`` to a
    gradient residual ``<= tolerance`` of ``J_i(w) = mean_{D_i} l(w) + (lambda/2)||w - start_i||^2``
    (``(mu + lambda)``-strongly convex, ``mu`` the ridge); ``gaps[i] = ||start_i - end_{i-1}||`` (``end_{-1} = 0``)
    is what happened to the model between tasks. The retrain ``w^R`` solves the same chain from ``w_{-1}^R = 0``
    on what is left (a fully forgotten task skipped). With ``rho = lambda/(mu + lambda)`` (the task solution is
    ``rho``-Lipschitz in its anchor) and ``tau = tolerance/(mu + lambda)``:

    * kept or partly forgotten (``m`` of ``n``): ``D_i <= rho (D_{i-1} + gap_i) + 2 m L_CE / (n (mu + lambda)) + tau``
      (at the retained solution ``x'``, ``||grad J_i(x')|| = (m/n)||mean_U grad - mean_{D minus U} grad||``, the
      ridge cancelling);
    * fully forgotten: ``D_i <= D_{i-1} + gap_i + (G + tolerance)/(mu + lambda)``
      (``||S_i(start_i) - start_i|| <= ||grad J_i(start_i)||/(mu + lambda) <= G/(mu + lambda)``, ``start_i`` in the
      ball where ``G`` holds).
    """
    mu = c.strong_convexity
    kappa, rho, tau = mu + reg_lambda, reg_lambda / (mu + reg_lambda), tolerance / (mu + reg_lambda)
    out, D = [], 0.0
    for n, m, gap in zip(sizes, removed, gaps):
        if m >= n:
            D = D + gap + (c.grad_bound + tolerance) / kappa
        else:
            D = rho * (D + gap) + 2 * m * c.data_lipschitz / (n * kappa) + tau
        out.append(D)
    return out


def newton_chain(
    sizes: Sequence[int],
    removed: Sequence[int],
    gaps: Sequence[float],
    c: ModelConstants,
    reg_lambda: float,
    tolerance: float,
) -> float:
    """[derived] ``E``, a bound on ``||w^R - (end + correction)||`` for [CCL] Alg. 2's correction (the linearised
    chain of :func:`~lightning_unlearn.functional.ccl.hessian_correction` with exact task Hessians).

    Per task (``q = m/(n - m)``, ``kappa = mu + lambda``, ``rho = lambda/kappa``, ``rho_M = lambda/(M + lambda)``,
    ``b_i = D_{i-1} + gap_i`` the bound on ``||w_{i-1}^R - start_i||`` of :func:`forgetting_chain`):

    * fully forgotten: ``E_i = E_{i-1}`` (the correction then equals the retrain's skip exactly);
    * otherwise ``E_i <= rho E_{i-1} + beta_i + nu_i``, with the transport error ``beta_i`` (the solution map's
      Jacobian and the recorded ``(H_i + lambda I)^{-1} lambda`` both have spectra in ``[rho_M, rho]``; with ``K``
      the Jacobian moves by at most ``K rho^2 ||x - y||/kappa``):
      ``beta_i = min((rho - rho_M) b_i, rho (q (M - mu) + K s_i) b_i / kappa + K rho^2 b_i^2 / (2 kappa))``
      and the partial task's Newton error (a kept task: its residual ``tau``)
      ``nu_i = gbar_i min(1/kappa - 1/(M + lambda), (q (M - mu) + K s_i / 2)/kappa^2) + (1 + q) tolerance / kappa``,
      where ``gbar_i = q (2 L_CE + tolerance)`` bounds the step's gradient and ``s_i = (gbar_i + (1 + q) tolerance)/
      kappa`` its length.

    Without a Hessian-Lipschitz constant only the first-order forms are used.
    """
    mu, M, K = c.strong_convexity, c.smoothness, c.hessian_lipschitz
    kappa = mu + reg_lambda
    rho, rho_m = reg_lambda / kappa, reg_lambda / (M + reg_lambda)
    D = forgetting_chain(sizes, removed, gaps, c, reg_lambda, tolerance)
    E = 0.0
    for i, (n, m, gap) in enumerate(zip(sizes, removed, gaps)):
        if m >= n:
            continue
        b = (D[i - 1] if i else 0.0) + gap
        q = m / (n - m)
        gbar = q * (2 * c.data_lipschitz + tolerance)
        s = (gbar + (1 + q) * tolerance) / kappa
        beta = (rho - rho_m) * b
        newton = 1 / kappa - 1 / (M + reg_lambda)
        if K is not None:
            beta = min(beta, rho * (q * (M - mu) + K * s) * b / kappa + K * rho**2 * b**2 / (2 * kappa))
            newton = min(newton, (q * (M - mu) + K * s / 2) / kappa**2)
        E = rho * E + beta + gbar * newton + (1 + q) * tolerance / kappa
    return E
