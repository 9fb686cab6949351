"""Models the methods are defined on: a frozen backbone with an analytic (closed-form) head."""

from __future__ import annotations

from itertools import chain
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn
from torch.func import functional_call

from lightning_unlearn.contract import attached_trainer
from lightning_unlearn.functional.newton_cg import NewtonCGResult, newton_cg
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.regularization import ProximalRegularizer
from lightning_unlearn.warnings import warn


class RandomExpansion(nn.Module):
    """The nonlinear map G of eq. (1): ``f = ReLU(b P)`` with a fixed Gaussian projection ``P``.

    A random-projection feature expansion (as in analytic continual learning); ``P`` is a buffer,
    seeded, so it is saved with the module and identical across ranks and restarts.
    """

    P: Tensor

    def __init__(self, in_features: int, out_features: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("P", torch.randn(in_features, out_features, generator=g) / in_features**0.5)

    def forward(self, b: Tensor) -> Tensor:
        return torch.relu(b @ self.P.to(b.dtype))


def float64_forward(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` computed in float64 and eval mode, without changing ``module``.

    The analytic path runs the frozen backbone in float64: a float32 matmul's last bits depend
    on the batch's row count (the BLAS kernel chosen for it), so the float32 features of one
    sample differ between its training batch and a forget request by up to ~1e-7 relative, and
    forgetting would subtract a slightly different ``f^T f`` than was learned. In float64 the same
    effect is ~1e-16 relative. The module's floating-point parameters and buffers are cast for the
    call only (``torch.func.functional_call``); integer inputs (e.g. token ids) are passed as they are.
    """
    tensors = {
        name: t.to(torch.float64) if t.is_floating_point() else t
        for name, t in chain(module.named_parameters(), module.named_buffers())
    }
    with torch.no_grad(), eval_mode(module):
        return functional_call(module, tensors, (x.to(torch.float64) if x.is_floating_point() else x,))


class AnalyticHead(nn.Module):
    """An analytic classifier for a user's frozen backbone: optional expansion G and a float64 ridge head.

    Add it to your own ``LightningModule`` beside the frozen backbone, apply it to the backbone's
    output in ``forward`` and name both to an :class:`AnalyticRecorder`
    (``AnalyticRecorder(backbone="trunk", head="head")``), which solves ``linear`` in closed form
    after each experience (eq. 3) and is the only writer of its weights. It is never trained by
    gradients (its parameters do not require them).

    Args:
        in_features: width of the backbone's (flattened) output.
        num_classes: ``d_C``.
        expansion_dim: width of the random expansion G of eq. (1) (``None``: no expansion).
        bias: add a bias; it is solved as the weight of a constant feature 1 appended to ``f``, so
            it is regularised by ``gamma`` like the other weights [interp].
        seed: seed of G's projection.
    """

    def __init__(
        self, in_features: int, num_classes: int, expansion_dim: int | None = None, bias: bool = False, seed: int = 0
    ) -> None:
        super().__init__()
        self.expansion = RandomExpansion(in_features, expansion_dim, seed) if expansion_dim else nn.Identity()
        self.linear = nn.Linear(expansion_dim or in_features, num_classes, bias=bias, dtype=torch.float64)
        nn.init.zeros_(self.linear.weight)
        if bias:
            nn.init.zeros_(self.linear.bias)
        self.linear.requires_grad_(False)

    def features(self, b: Tensor) -> Tensor:
        """``f = G(b)`` of eq. (1) for a batch of backbone outputs ``b`` (flattened, float64)."""
        return self.expansion(b.flatten(1).to(torch.float64))

    def forward(self, b: Tensor) -> Tensor:
        return self.linear(self.features(b))


class AnalyticHeadModule(L.LightningModule):
    """Base class of your own ``LightningModule`` whose only learned part is an :class:`AnalyticHead` that an
    :class:`AnalyticRecorder` solves in closed form, beside a frozen backbone.

    No gradient trains such a module: the recorder runs the named backbone itself (float64, eval mode) and writes the
    head. This class gives the module the form Lightning accepts without a warning: manual optimization and a
    ``training_step`` that steps an optimizer changing nothing (SGD with ``lr=0`` over the heads' parameters) once per
    batch, so that Lightning counts the batches as steps (``max_steps``, step-based checkpoints, the step requests
    are logged at). Override ``validation_step``/``test_step`` as usual.

    Raises:
        ValueError: at fit start, the module holds no :class:`AnalyticHead`.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import AnalyticHead, AnalyticHeadModule, AnalyticRecorder, IndexedDataset
        >>> class MyNet(AnalyticHeadModule):  # e.g. a torchvision resnet18 trunk with fc = nn.Identity()
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.trunk = nn.Sequential(nn.Linear(4, 16), nn.ReLU()).requires_grad_(False)
        ...         self.head = AnalyticHead(16, 3, expansion_dim=32)
        ...     def forward(self, x: torch.Tensor) -> torch.Tensor:
        ...         return self.head(self.trunk(x))
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = MyNet(), AnalyticRecorder(ridge=1.0, backbone="trunk", head="head")
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...                     enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(model, DataLoader(data, batch_size=8))
        >>> trainer.global_step, tuple(model.head.linear.weight.shape)  # 4 steps counted; the head solved
        (4, (3, 32))
    """

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.optimizers().step()  # type: ignore[union-attr]  # no gradient, no change: counts the step

    def configure_optimizers(self) -> torch.optim.Optimizer:
        heads = [p for m in self.modules() if isinstance(m, AnalyticHead) for p in m.parameters()]
        if not heads:
            raise ValueError(f"{type(self).__name__} is an AnalyticHeadModule but holds no AnalyticHead")
        return torch.optim.SGD(heads, lr=0.0)


class AnalyticClassifier(L.LightningModule):
    """Frozen backbone, optional expansion G, and a bias-free float64 ridge head ``W`` (eq. 1-3).

    Training is gradient-free: fit it with an :class:`AnalyticRecorder` callback, which solves
    the head in closed form after each experience. ``training_step`` computes float64 features
    (see :func:`float64_forward`) and hands them to the recorder. It steps an optimizer that
    changes nothing (SGD with ``lr=0`` and no gradients) once per batch, so that Lightning counts
    training steps: ``ModelCheckpoint`` writes the checkpoints of an analytic fit as of any other
    (it skips a fit whose step count never moves), and ``max_steps`` / ``every_n_train_steps``
    mean batches. For a backbone inside
    your own ``LightningModule`` use :class:`AnalyticHead` instead.
    """

    def __init__(
        self, backbone: nn.Module, backbone_dim: int, num_classes: int, expansion_dim: int | None = None, seed: int = 0
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])  # reload: load_from_checkpoint(path, backbone=...)
        # frozen: no gradients, and it always runs in eval mode (float64_forward), so its mode flag follows the
        # classifier's like any submodule's (Lightning warns about modules left in eval mode when a fit starts)
        self.backbone = backbone.requires_grad_(False).train()
        self.expansion = RandomExpansion(backbone_dim, expansion_dim, seed) if expansion_dim else nn.Identity()
        d_F = expansion_dim or backbone_dim
        # the head is the learned parameter; it is solved in closed form, never by an optimizer
        # (it keeps requires_grad so that DDP accepts the module)
        self.head = nn.Linear(d_F, num_classes, bias=False, dtype=torch.float64)
        nn.init.zeros_(self.head.weight)
        self.num_classes = num_classes
        self.automatic_optimization = False

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        return self.expansion(float64_forward(self.backbone, x))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        features = self.features(batch[0])
        if attached_trainer(self) is not None:
            self.optimizers().step()  # type: ignore[union-attr]  # no gradient, no change: counts the step
        return {"features": features}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([self.head.weight], lr=0.0)


def mlp_backbone(in_features: int, hidden: int = 128, out_features: int = 64) -> nn.Sequential:
    """A small MLP used as a stand-in pre-trained backbone in examples and tests."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features), nn.ReLU()
    )


class SupervisedClassifier(L.LightningModule):
    """A convenience network trained by mini-batch SGD on ``mean CE`` with ``weight_decay = l2``.

    Plain SGD with weight decay ``l2`` follows the gradient of ``mean CE + (l2/2) ||theta||^2``, the
    objective the gradient-based recorders reason about (they read ``l2`` from the optimizer, see
    :mod:`lightning_unlearn.contract`). Any LightningModule with a per-sample loss works the same way;
    this class is not required.

    Args:
        net: maps inputs to logits.
        lr: SGD step size.
        l2: SGD ``weight_decay`` (the ridge ``lambda`` of ``(lambda/2)||theta||^2``).
        momentum: SGD momentum (keep 0 for methods that replay the SGD trajectory).
    """

    def __init__(self, net: nn.Module, lr: float = 0.1, l2: float = 0.0, momentum: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net"])  # reload: load_from_checkpoint(path, net=...)
        self.net = net
        self.lr, self.l2, self.momentum = lr, l2, momentum

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def objective(self, x: Tensor, y: Tensor) -> Tensor:
        """The training loss: mean cross-entropy (the ridge is the optimizer's weight decay)."""
        return nn.functional.cross_entropy(self(x), y.long())

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.objective(batch[0], batch[1])
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch[1]))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.l2)


class ProximalClassifier(SupervisedClassifier):
    """A convenience :class:`SupervisedClassifier` trained with [CCL]'s regulariser, a :class:`ProximalRegularizer`.

    ``loss = mean CE + (l2/2)||theta||^2 + (reg_lambda/2)||theta - anchor||^2`` ([CCL] Eq. (1), with
    the mean task loss of its Section 5.1); the per-sample loss of [CCL] is ``CE + (l2/2)||theta||^2``,
    so ``l2`` is its strong-convexity constant ``mu`` (for a linear net). Both penalties come from
    :attr:`regularizer` (``in_loss=True``, ``ridge=l2``; L-BFGS has no weight decay), which the module
    hands to the Trainer through ``configure_callbacks``: it anchors at the start of every fresh fit
    (``w_0 = 0`` for the first task). [CCL] assumes each task is solved exactly:
    ``optimizer="lbfgs"`` with full-batch loaders comes close for convex models; L-BFGS stops when the
    objective's value no longer changes, which in float32 can be well above a certificate's tolerance on an
    ill-conditioned task. ``newton_tolerance`` finishes every epoch with Newton-CG on the epoch's objective
    (:func:`~lightning_unlearn.functional.newton_cg.newton_cg`: the training loss over all the epoch's batches,
    weighted by their sizes, module in eval mode) until its gradient norm is at most ``newton_tolerance``; the
    outcome is :attr:`newton_results` (one per epoch; a run that stops above the tolerance warns). Under DDP
    each rank finishes on its own loader: use it with full-batch, unsharded loaders (``use_distributed_sampler=
    False``), where every rank holds the whole task. Under another loop (Avalanche), pass :attr:`regularizer`
    to the strategy's plugins.

    Args:
        net: maps inputs to logits.
        lr: step size (SGD) or initial step (L-BFGS).
        l2: ridge coefficient of the per-sample loss.
        reg_lambda: [CCL]'s ``lambda`` (> 0).
        optimizer: ``"sgd"`` or ``"lbfgs"``.
        lbfgs_iters: L-BFGS iterations per training step.
        newton_tolerance: the gradient norm the Newton-CG finish reaches after each epoch (``None``: none).
    """

    def __init__(
        self,
        net: nn.Module,
        lr: float = 0.1,
        l2: float = 0.0,
        reg_lambda: float = 1.0,
        optimizer: str = "sgd",
        lbfgs_iters: int = 200,
        newton_tolerance: float | None = None,
    ) -> None:
        super().__init__(net, lr=lr, l2=l2, momentum=0.0)
        self.save_hyperparameters(ignore=["net", "momentum"])  # drops the base class's momentum (not an argument here)
        if reg_lambda <= 0:
            raise ValueError(f"ProximalClassifier reg_lambda must be positive, got {reg_lambda}")
        if optimizer not in ("sgd", "lbfgs"):
            raise ValueError(f"optimizer must be 'sgd' or 'lbfgs', got {optimizer!r}")
        if newton_tolerance is not None and not newton_tolerance > 0:
            raise ValueError(f"ProximalClassifier newton_tolerance must be positive, got {newton_tolerance}")
        self.reg_lambda, self.optimizer_name, self.lbfgs_iters = float(reg_lambda), optimizer, lbfgs_iters
        self.newton_tolerance = newton_tolerance
        self.newton_results: list[NewtonCGResult] = []
        self.regularizer = ProximalRegularizer(reg_lambda, in_loss=True, ridge=l2)

    def configure_callbacks(self) -> list[L.Callback]:
        # a Trainer reused for the next experience (fit_stream) holds it already: returning it again would only make
        # Lightning replace it by itself and say so on every fit
        trainer = attached_trainer(self)
        held = trainer is not None and any(c is self.regularizer for c in trainer.callbacks)  # type: ignore[attr-defined]
        return [] if held else [self.regularizer]

    def get_extra_state(self) -> Tensor:
        """The regulariser's task counter, in the module's ``state_dict``: a model reset to an initial state
        (e.g. by :class:`RetrainUnlearner`) anchors its first task at ``w_0 = 0`` again."""
        return self.regularizer.progress()

    def set_extra_state(self, state: Tensor) -> None:
        self.regularizer.load_progress(state)

    def start_task(self) -> None:
        """Anchor the regulariser (outside Lightning, e.g. under Avalanche, before each experience)."""
        self.regularizer.begin_experience(self)

    def end_task(self) -> None:
        """Close the experience (outside Lightning, after it)."""
        self.regularizer.end_experience(self)

    def objective(self, x: Tensor, y: Tensor) -> Tensor:
        return super().objective(x, y) + self.regularizer.penalty(self)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The objective on ``batch``; under DDP with L-BFGS its value is the mean over the ranks (its gradient
        stays this rank's, which DDP averages): L-BFGS's line search reads the value, and ranks that saw different
        values would make different numbers of closure calls, each a gradient all-reduce, and deadlock."""
        loss = super().training_step(batch, batch_idx)
        trainer = attached_trainer(self)
        if self.optimizer_name == "lbfgs" and trainer is not None and trainer.world_size > 1:
            value = loss.detach()
            loss = loss + (trainer.strategy.reduce(value, reduce_op="mean") - value)
        return loss

    def on_train_epoch_end(self) -> None:
        """The Newton-CG finish of the epoch's objective (``newton_tolerance``, see the class docstring)."""
        trainer = attached_trainer(self)
        if self.newton_tolerance is None or trainer is None:
            return
        batches = []
        for batch in trainer.train_dataloader:  # type: ignore[union-attr]
            batch = trainer.precision_plugin.convert_input(batch)
            batch = move_data_to_device(batch, self.device)
            batches.append((batch[0], batch[1]))
        n = sum(len(y) for _, y in batches)
        if not n:
            return

        def objective() -> Tensor:
            return sum(self.objective(x, y) * (len(y) / n) for x, y in batches)  # type: ignore[return-value]

        params = [p for p in self.parameters() if p.requires_grad]
        with eval_mode(self):
            result = newton_cg(objective, params, self.newton_tolerance)
        self.newton_results.append(result)
        if not result.converged:
            warn(
                f"ProximalClassifier: the Newton-CG finish stopped at a gradient norm {result.residual:.3g} > "
                f"newton_tolerance {self.newton_tolerance:g} after {result.steps} steps (no step decreased the "
                "objective further: float rounding, or a non-convex network)",
                cause=("Newton-CG finish above tolerance", type(self).__name__, self.newton_tolerance),
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_name == "lbfgs":
            return torch.optim.LBFGS(
                params,
                lr=self.lr,
                max_iter=self.lbfgs_iters,
                tolerance_grad=1e-12,
                tolerance_change=1e-15,
                line_search_fn="strong_wolfe",
            )
        return torch.optim.SGD(params, lr=self.lr)
