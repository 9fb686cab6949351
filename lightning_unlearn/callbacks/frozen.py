"""`FrozenFeatureRecorder`: the frozen backbone and linear head that the closed-form and convex heads share.

ACU's ridge head ([ACU]) and the certified softmax head (:mod:`lightning_unlearn.callbacks.convex`) both learn
a linear layer on the output of a frozen network, in float64, and are the only writers of that layer. This
base class names the two parts of the user's module, computes the float64 features (with a constant 1 for a
bias), refuses a backbone that is trainable or that moved during an experience, and writes a solution into
the head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import lightning as L
import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.binding import RAW_INPUTS, Binding
from lightning_unlearn.core.digest import ALGORITHM, tensors_digest
from lightning_unlearn.models import AnalyticHead, float64_forward
from lightning_unlearn.warnings import warn


class FrozenFeatureRecorder(RecorderCallback):
    """A recorder that solves a linear ``head`` on the features of a frozen ``backbone`` of the user's module.

    Two ways to name the model parts:

    * ``backbone="trunk", head="head"``: any ``LightningModule`` with a frozen submodule ``trunk``
      and an :class:`~lightning_unlearn.models.AnalyticHead` (or a plain ``nn.Linear``, with or without bias)
      ``head`` on its output. The recorder runs the backbone itself, in float64 and eval mode
      (:func:`~lightning_unlearn.models.float64_forward`); it puts the backbone in eval mode at fit
      start and refuses an experience during which the backbone's parameters or buffers changed
      (e.g. batch-norm statistics updated by a train-mode forward).
    * ``backbone=None``: the module has ``features(x) -> (n, d_F)`` and an ``nn.Linear`` ``head``, e.g.
      :class:`~lightning_unlearn.models.AnalyticClassifier`; for recorders with :attr:`inputs_as_features`, a
      module without ``features`` is a linear model on the flattened inputs.

    Args:
        dtype: dtype of the statistics and features.
        backbone: name of the frozen backbone submodule, or ``None``.
        head: name of the head submodule.
        device: where the statistics live (default: the head's device).
        fingerprint: see :class:`RecorderCallback`.
    """

    #: the method's name in messages
    solver_name = "the head's solver"
    #: without ``backbone`` and without a module ``features`` method, the head reads the flattened inputs
    inputs_as_features = False

    def __init__(
        self,
        *,
        dtype: torch.dtype = torch.float64,
        backbone: str | None = None,
        head: str = "head",
        device: str | torch.device | None = None,
        fingerprint: bool = True,
    ) -> None:
        super().__init__(fingerprint=fingerprint)
        self.dtype = dtype
        self.backbone = backbone
        self.head = head
        self.device = torch.device(device) if device is not None else None
        self._frozen_digest: str | None = None
        self._backbone_mode: tuple[nn.Module, bool] | None = None  # the backbone and its mode before the fit

    def head_of(self, module: nn.Module) -> nn.Linear:
        """The ``nn.Linear`` whose weights are ``W`` (that of an :class:`AnalyticHead`).

        Raises:
            ValueError: the module has no such head, or (without ``backbone``) no ``features`` method.
        """
        try:
            head = module.get_submodule(self.head)
        except AttributeError:
            head = None
        linear = head.linear if isinstance(head, AnalyticHead) else head
        if not isinstance(linear, nn.Linear):
            raise ValueError(  # noqa: TRY004  (a configuration error, like the other refusals)
                f"{self.solver_name} needs an nn.Linear or AnalyticHead submodule {self.head!r}, "
                f"got {type(head).__name__ if head is not None else 'none'}"
            )
        if self.backbone is None and not self.inputs_as_features and not callable(getattr(module, "features", None)):
            raise ValueError(
                f"{self.solver_name} needs the frozen backbone: name it ({type(self).__name__}(backbone='...')) "
                "or give the module a features(x) method (e.g. lightning_unlearn.AnalyticClassifier)"
            )
        return linear

    def backbone_of(self, module: nn.Module) -> nn.Module:
        """The named frozen backbone. Raises ``ValueError`` if the module has none of that name."""
        if self.backbone is None:
            raise ValueError(f"{type(self).__name__} names no backbone submodule (backbone=...)")
        try:
            return module.get_submodule(self.backbone)
        except AttributeError as err:
            raise ValueError(f"the module has no backbone submodule {self.backbone!r}") from err

    def head_names(self, module: nn.Module) -> list[str]:
        """``state_dict`` names of the head's weight and (if any) bias."""
        linear = self.head_of(module)
        names = {id(p): n for n, p in module.named_parameters()}
        return [names[id(p)] for p in (linear.weight, linear.bias) if p is not None]

    def head_weights(self, module: nn.Module, W: Tensor) -> dict[str, Tensor]:
        """``{state_dict name: value}`` of the head's weight (``W^T``) and bias (last row of ``W``) for ``W``, copies:
        a module's weights never share memory with the statistics (an in-place write into the module, e.g.
        Lightning restoring a checkpoint, would change them too)."""
        d_F = self.head_of(module).in_features
        return dict(zip(self.head_names(module), (W[:d_F].T.clone(), *(b.clone() for b in W[d_F:]))))

    def features(self, module: nn.Module, x: Tensor) -> Tensor:
        """Float64 features ``f`` of eq. (1) for inputs ``x`` (with a constant 1 appended for a biased head)."""
        linear = self.head_of(module)
        if self.backbone is not None:
            b = float64_forward(self.backbone_of(module), x)
            head = module.get_submodule(self.head)
            F = head.features(b) if isinstance(head, AnalyticHead) else b.flatten(1)
        elif callable(getattr(module, "features", None)):
            with torch.no_grad():
                F = cast(Callable[[Tensor], Tensor], module.features)(x)
        else:  # head_of allowed it: the head reads the flattened input itself
            F = x.detach().flatten(1).to(torch.float64)
        return self._augment(F, linear)

    def _augment(self, F: Tensor, linear: nn.Linear) -> Tensor:
        if F.dtype != torch.float64:
            warn(
                f"{self.solver_name} features are {F.dtype}: their last bits depend on the batch size, so the "
                "statistics are exact only up to that precision (compute them in float64, see "
                "lightning_unlearn.models.float64_forward)"
            )
        F = F.detach().to(device=self._stats_device(linear), dtype=self.dtype)
        if linear.bias is not None:
            F = torch.cat([F, F.new_ones(len(F), 1)], dim=1)
        return F

    def _stats_device(self, linear: nn.Linear) -> torch.device:
        return self.device if self.device is not None else linear.weight.device

    def _frozen_state_digest(self, module: nn.Module) -> str:
        """BLAKE3 of the parameters and buffers the features come through: the backbone's and the head's besides its
        solved weights (an :class:`~lightning_unlearn.models.AnalyticHead`'s expansion); without ``backbone``, every
        entry of the module's ``state_dict`` but the solved weights."""
        solved = set(self.head_names(module))
        parts = (f"{self.backbone}.", f"{self.head}.")
        return tensors_digest(
            {
                k: v
                for k, v in module.state_dict().items()
                if k not in solved and (self.backbone is None or k.startswith(parts))
            }
        )

    def binding_of(self, module: nn.Module) -> Binding:
        """The statistics' binding: the digest of the frozen tensors the features come through (the backbone, and
        the head besides its solved weights; without ``backbone``: the module outside the solved weights;
        :data:`~lightning_unlearn.core.binding.RAW_INPUTS` for a head on the inputs), the solved weights' names
        and shapes, and the sample-id field."""
        ids = super().binding_of(module).ids
        names = set(self.head_names(module))
        head = tuple(sorted((n, tuple(p.shape)) for n, p in module.named_parameters() if n in names))
        if self.backbone is None and self.inputs_as_features and not callable(getattr(module, "features", None)):
            return Binding(RAW_INPUTS, RAW_INPUTS, head, ids)
        where = f"backbone {self.backbone!r} and head {self.head!r}" if self.backbone is not None else "module"
        part = f"the frozen parameters and buffers of the {where} (besides the solved head weights)"
        return Binding(self._frozen_state_digest(module), part, head, ids)

    def check_frozen(self, module: nn.Module) -> None:
        """Refuse trainable backbone parameters, and remember the backbone's state (see :meth:`check_unchanged`).

        Raises:
            ValueError: parameters of the backbone (without ``backbone``: of the module outside the head)
                require gradients.
        """
        if self.backbone is not None:
            trainable = [n for n, p in self.backbone_of(module).named_parameters() if p.requires_grad]
            where = f"backbone {self.backbone!r}"
        else:
            head = set(self.head_names(module))
            trainable = [n for n, p in module.named_parameters() if p.requires_grad and n not in head]
            where = "module outside the head"
        if trainable:
            raise ValueError(
                f"{self.solver_name} needs a frozen backbone, but these parameters of the {where} are trainable: "
                f"{trainable[:5]}"
            )
        self._frozen_digest = self._frozen_state_digest(module)

    def check_unchanged(self, module: nn.Module) -> None:
        """``ValueError`` if the backbone's parameters or buffers changed since :meth:`check_frozen`."""
        if self._frozen_digest is not None and self._frozen_state_digest(module) != self._frozen_digest:
            where = f"backbone {self.backbone!r}" if self.backbone is not None else "module outside the head"
            raise ValueError(
                f"the {where} changed during the experience (parameters or buffers, e.g. batch-norm running "
                f"statistics of a train-mode forward): {self.solver_name} needs a frozen backbone; its statistics "
                "were not updated"
            )

    def _staged_state(self) -> dict[str, Any]:
        return {"frozen_digest": self._frozen_digest}

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        # the running fit's backbone digest (one of an older version, not BLAKE3, is taken again at the fit's start)
        saved = state.get("frozen_digest")
        if isinstance(saved, str) and saved.startswith(ALGORITHM + ":"):
            self._frozen_digest = saved

    def write_weights(self, module: nn.Module, W: Tensor) -> None:
        """Copy ``W`` into the head (an ``nn.Linear`` stores ``W^T``; a bias is the last row of ``W``)."""
        params = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in self.head_weights(module, W).items():
                params[name].copy_(value)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.backbone is not None:
            backbone = self.backbone_of(pl_module)
            self._backbone_mode = (backbone, backbone.training)
            backbone.eval()  # frozen: batch-norm statistics and dropout must not move
        super().on_train_start(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._restore_backbone_mode()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._restore_backbone_mode()

    def _restore_backbone_mode(self) -> None:
        """The backbone's mode as it was before the fit: Lightning warns about modules in eval mode when the next
        fit starts, and the eval mode was the recorder's doing, not the user's."""
        if self._backbone_mode is not None:
            backbone, training = self._backbone_mode
            backbone.train(training)
            self._backbone_mode = None
