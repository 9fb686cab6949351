"""The "your module" contract: what lightning-unlearn reads from a user's data and model.

This docstring is the one place the contract is written down; everything below implements it.

**Batches.** Every recorder and strategy reads a batch through :func:`unpack_batch`, so a batch
may be

* a tuple or list ``(x, y, sample_id, ...)``: input, target, sample ids, then anything
  (e.g. a task label: ``(x, y, sample_id, task)``); or
* a mapping (a dict batch): the input, target and sample ids are read under the keys of a
  :class:`BatchKeys`. By default each is the first key present among ``("x", "input")``,
  ``("y", "target", "label")`` and ``("sample_id", "id")``; name your own keys with
  ``BatchKeys(input="image", target="cls", sample_id="uid")``, given to the recorder
  (``RecorderCallback(batch_keys=...)`` or its ``batch_keys`` attribute); strategies read the
  keys from their recorder.

``x`` is a tensor with one row per sample, ``y`` integer class labels, ``sample_id`` an integer
tensor with one id per row, unique and stable (a sample keeps its id across epochs,
experiences and processes): a recorder refuses a batch whose id names another sample (label or input)
than earlier in the epoch, e.g. Avalanche's task labels read as ids.
:class:`~lightning_unlearn.data.IndexedDataset` adds ids to any dataset of tuples or dicts. Avalanche
datasets keep Avalanche's items ``(x, y, task)`` and carry the id as their data attribute ``sample_id``
(:mod:`lightning_unlearn.avalanche.benchmarks`); ``fit_stream``
and the Avalanche plugin read it from there.

**Analytic heads.** A module whose only learned part is an
:class:`~lightning_unlearn.models.AnalyticHead` (solved in closed form by an ``AnalyticRecorder``) is
not trained by gradients: subclass :class:`~lightning_unlearn.models.AnalyticHeadModule`, which
gives it manual optimization and a ``training_step``/``configure_optimizers`` that step an ``lr=0``
optimizer once per batch (Lightning then counts steps and warns about nothing).

**How a loss is obtained.**

* Training-based strategies (fine-tune, NegGrad, NegGrad+, random labels, RBM/SalUn, retrain)
  train a copy of a *self-training* module (:func:`trains_itself`: a ``LightningModule`` with
  automatic optimization and its own ``configure_optimizers``) through its own
  ``training_step`` and optimizer. The unlearning objective is written in terms of the
  module's own training loss ``L(batch)`` (:func:`training_loss`, the tensor ``training_step``
  returns or its ``"loss"`` entry): NegGrad minimises ``-L(forget batch)``, NegGrad+
  ``alpha L(retain batch) - (1 - alpha) L(forget batch)``, random labels and RBM feed the
  forget samples with replaced targets to ``L``. The strategy's ``lr``, if given, overrides
  the learning rate of every parameter group.
* Any other module (a plain ``nn.Module``, or a ``LightningModule`` with manual optimization
  such as :class:`~lightning_unlearn.models.AnalyticClassifier`) is trained on the mean of a
  per-sample ``loss_fn(outputs, targets)`` with ``outputs = module(x)``, by plain SGD. The
  default ``loss_fn`` is cross-entropy.
* Methods that need a per-sample loss (recorders of per-sample statistics, saliency) take
  ``loss_fn(outputs, targets) -> (n,)``; :func:`resolve_loss_fn` gives the default and, on one
  batch, checks it against the module's own training loss (:func:`check_loss_fn`), so that a
  label-smoothed or otherwise custom loss is never silently replaced by cross-entropy.

**The regulariser and the learning rate** (gradient-based recorders: :class:`TrajectoryRecorder`
for [HF], :class:`CCLRecorder` / :class:`CCLHessianRecorder` for [CCL]). The per-sample loss these
recorders reason about is ``l(w; z) = loss_fn(module(x), y) + (l2/2)||w||^2``; ``l2`` is read from the
Trainer's optimizer (:func:`read_optimizer`): its ``weight_decay`` (SGD's and Adam's add ``l2 * w`` to
the gradient, the gradient of that ridge; AdamW's decoupled decay is refused), plus the ``ridge`` of a
:class:`~lightning_unlearn.callbacks.ProximalRegularizer` for optimizers without weight decay (L-BFGS).
[CCL]'s proximal term ``(lambda/2)||w - w_{i-1}||^2`` comes from that callback (any module can use it;
with ``in_loss=True`` the module adds its ``penalty`` to the loss, which :func:`check_loss_fn` then
expects). The learning rate of each step is read from the optimizer when the step runs, so
schedulers are followed; methods replaying plain SGD ([HF]) refuse momentum and Nesterov
(:func:`require_plain_sgd`). Modules need no particular attribute or base class: [CCL]'s
``TaskOptimality`` measures the gradient of the same objective, the module's ``training_step`` loss
(:func:`training_loss`) averaged over the task's data, plus a proximal callback's penalty and the
optimizer's weight decay.

``training_step`` is called outside the ``Trainer`` by :func:`training_loss` (for checks, saliency
gradients and ``TaskOptimality``; a module attached to a Trainer is detached for the call): it may call
``self.log`` (ignored there) but must not need ``self.trainer``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn

from lightning_unlearn.modes import eval_mode

#: per-sample loss: ``loss_fn(outputs, targets) -> (n,)`` with ``outputs = module(x)``
LossFn = Callable[[Tensor, Tensor], Tensor]

#: default key names of a dict batch, in order of precedence
DEFAULT_KEYS: dict[str, tuple[str, ...]] = {
    "input": ("x", "input"),
    "target": ("y", "target", "label"),
    "sample_id": ("sample_id", "id"),
}


@dataclass(frozen=True)
class BatchKeys:
    """Keys of the input, target and sample ids in dict batches; ``None``: the first of :data:`DEFAULT_KEYS` present."""

    input: str | None = None
    target: str | None = None
    sample_id: str | None = None

    def id_field(self) -> str:
        """Where the sample ids are read from, in words (in a recorder's :mod:`~lightning_unlearn.core.binding`)."""
        keys = (self.sample_id,) if self.sample_id is not None else DEFAULT_KEYS["sample_id"]
        return f"item 2 of tuple batches or key {' / '.join(map(repr, keys))} of dict batches"

    def key(self, batch: Mapping[str, Any], field: str) -> str:
        """The key of ``field`` (``"input"``, ``"target"`` or ``"sample_id"``) in ``batch``; ``ValueError`` if none."""
        chosen = getattr(self, field)
        names = (chosen,) if chosen is not None else DEFAULT_KEYS[field]
        for name in names:
            if name in batch:
                return name
        hint = " (wrap the dataset in lightning_unlearn.IndexedDataset)" if field == "sample_id" else ""
        raise ValueError(
            f"dict batch has no {field} under {' / '.join(map(repr, names))}{hint}; its keys: {sorted(batch)[:10]}. "
            f"Name the keys with BatchKeys({field}=...)"
        )


def unpack_batch(batch: Any, keys: BatchKeys | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, y, sample_ids)`` of a tuple batch ``(x, y, sample_id, ...)`` or a dict batch (see the module docstring).

    Raises:
        ValueError: the batch carries no sample ids, or they are not one integer per row.
    """
    if isinstance(batch, Mapping):
        k = keys or BatchKeys()
        x, y, ids = batch[k.key(batch, "input")], batch[k.key(batch, "target")], batch[k.key(batch, "sample_id")]
    elif isinstance(batch, (list, tuple)) and len(batch) >= 3:
        x, y, ids = batch[0], batch[1], batch[2]
    else:
        raise ValueError(
            "batch carries no sample ids: recorders need (x, y, sample_id, ...) tuples or dicts with a sample id "
            "entry; wrap the dataset in lightning_unlearn.IndexedDataset"
        )
    y = torch.as_tensor(y)
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32) or ids.shape != y.shape[:1]:
        raise ValueError(f"sample ids must be an integer tensor, one per row, got {ids!r:.80}")
    return x, y, ids.long()


def with_target(item: Any, target: Any, keys: BatchKeys | None = None) -> Any:
    """A copy of one item or batch (tuple or dict, as in :func:`unpack_batch`) with its target replaced.

    The new target takes the type of the old one (a tensor's dtype), so items still collate together.
    """
    if isinstance(item, Mapping):
        key = (keys or BatchKeys()).key(item, "target")
        return {**item, key: _like(item[key], target)}
    if isinstance(item, (list, tuple)) and len(item) >= 2:
        new = [item[0], _like(item[1], target), *item[2:]]
        return new if isinstance(item, list) else tuple(new)
    raise ValueError(
        f"cannot replace the target of an item of type {type(item).__name__}: expected a tuple (x, y, ...) or a dict"
    )


def _like(old: Any, value: Any) -> Any:
    return torch.as_tensor(value, dtype=old.dtype, device=old.device) if isinstance(old, Tensor) else type(old)(value)


def trains_itself(module: nn.Module) -> TypeGuard[L.LightningModule]:
    """Whether ``module`` is trained through its own ``training_step`` and ``configure_optimizers``.

    True for a ``LightningModule`` with automatic optimization that overrides both; such a module
    is unlearned with its own loss and optimizer. Any other module is trained on ``loss_fn`` by SGD.
    """
    return (
        isinstance(module, L.LightningModule)
        and module.automatic_optimization
        and is_overridden("training_step", module)
        and is_overridden("configure_optimizers", module)
    )


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The Trainer ``module`` is attached to, ``None`` outside one: Lightning's ``module.trainer`` raises
    ``RuntimeError`` when there is none."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def training_loss(module: L.LightningModule, batch: Any, batch_idx: int = 0) -> Tensor:
    """The module's own training loss on ``batch``: what its ``training_step`` returns (or its ``"loss"``).

    The method of the module's class is called, so a strategy may wrap ``training_step`` on an
    instance around this. It runs outside the ``Trainer``: a module attached to one (a check during a
    fit) is detached for the call (Lightning's ``module.trainer`` setter) and attached again, so its
    ``self.log`` calls are ignored instead of logging, or failing in a hook that may not log.

    Raises:
        ValueError: ``training_step`` returns no loss, or fails because it needs a ``Trainer``.
    """
    trainer = attached_trainer(module)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"You are trying to `self.log\(\)`")
        try:
            module.trainer = None
            out = type(module).training_step(module, batch, batch_idx)
        except RuntimeError as err:
            if "not attached to a `Trainer`" not in str(err):
                raise
            raise ValueError(
                f"{type(module).__name__}.training_step needs self.trainer; lightning-unlearn calls it outside "
                "the Trainer to read the loss (see lightning_unlearn.contract)"
            ) from err
        finally:
            module.trainer = trainer
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(loss, Tensor) or loss.ndim != 0:
        raise ValueError(
            f"{type(module).__name__}.training_step must return the scalar loss or a dict with 'loss', got {out!r:.80}"
        )
    return loss


def per_sample_cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """The default ``loss_fn``: cross-entropy of logits ``outputs`` per sample."""
    return nn.functional.cross_entropy(
        outputs.to(torch.promote_types(outputs.dtype, torch.float32)), targets.long(), reduction="none"
    )


def check_loss_fn(
    module: L.LightningModule,
    loss_fn: LossFn,
    batch: Any,
    *,
    keys: BatchKeys | None = None,
    penalty: Callable[[nn.Module], Tensor] | None = None,
    rtol: float = 1e-4,
) -> None:
    """Check that ``mean(loss_fn(module(x), y)) + penalty(module)`` is the module's own training loss on ``batch``.

    Both are evaluated in eval mode (no dropout, fixed batch-norm statistics) without gradients,
    so the module is not changed. ``rtol`` is relative to ``max(1, |training loss|)``: the
    default allows float32 summation-order differences (about ``n * eps``) for batches of
    hundreds of samples.

    Raises:
        ValueError: ``loss_fn`` does not give one loss per sample, or the two losses differ
            (e.g. the module trains with label smoothing and ``loss_fn`` is plain cross-entropy).
    """
    x, y, _ = unpack_batch(batch, keys)
    with torch.no_grad(), eval_mode(module):
        expected = float(training_loss(module, batch))
        per_sample = loss_fn(module(x), y)
        if per_sample.shape != y.shape[:1]:
            raise ValueError(
                f"loss_fn must return one loss per sample, shape ({len(y)},), got {tuple(per_sample.shape)}"
            )
        got = float(per_sample.float().mean()) + (float(penalty(module)) if penalty is not None else 0.0)
    if abs(got - expected) > rtol * max(1.0, abs(expected)):
        raise ValueError(
            f"loss_fn disagrees with {type(module).__name__}.training_step on a batch: mean loss_fn"
            f"{' + penalty' if penalty is not None else ''} = {got:.6g}, training loss = {expected:.6g}. "
            "Pass loss_fn(outputs, targets) -> per-sample loss matching the module's training loss"
        )


def resolve_loss_fn(
    module: nn.Module,
    loss_fn: LossFn | None = None,
    batch: Any = None,
    *,
    keys: BatchKeys | None = None,
    penalty: Callable[[nn.Module], Tensor] | None = None,
) -> LossFn:
    """The per-sample loss to use for ``module``: ``loss_fn``, or cross-entropy by default.

    With a ``batch`` and a module that :func:`trains_itself`, the loss is checked against the
    module's own training loss on it (:func:`check_loss_fn`), e.g. at fit start.

    Raises:
        TypeError: ``loss_fn`` is not callable.
        ValueError: the check fails.
    """
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(outputs, targets), got {type(loss_fn).__name__}")
    resolved = loss_fn or per_sample_cross_entropy
    if batch is not None and trains_itself(module):
        check_loss_fn(module, resolved, batch, keys=keys, penalty=penalty)
    return resolved


@dataclass(frozen=True)
class OptimizerRecipe:
    """What a recorder reads from the Trainer's optimizer (all param groups agree)."""

    name: str
    lr: float
    weight_decay: float
    momentum: float
    nesterov: bool


def read_optimizer(optimizers: list[torch.optim.Optimizer], module: nn.Module | None, who: str) -> OptimizerRecipe:
    """The single optimizer's recipe, checked against the module's trainable parameters (if given).

    Raises:
        ValueError: not exactly one optimizer; param groups with different ``lr``/``weight_decay``/momentum;
            decoupled weight decay (AdamW); trainable parameters the optimizer does not update (they
            would be part of ``w`` without moving).
    """
    if len(optimizers) != 1:
        raise ValueError(f"{who} reads one optimizer, the Trainer has {len(optimizers)}")
    opt = optimizers[0]
    name = type(opt).__name__
    keys = ("lr", "weight_decay", "momentum", "nesterov")
    values = {tuple(g.get(k, 0) for k in keys) for g in opt.param_groups}
    if len(values) != 1:
        raise ValueError(
            f"{who}: the param groups of {name} differ in (lr, weight_decay, momentum, nesterov): {sorted(values)}"
        )
    if isinstance(opt, torch.optim.AdamW) and opt.param_groups[0].get("weight_decay", 0):
        raise ValueError(
            f"{who}: AdamW's decoupled weight decay is not a ridge term of the loss; use SGD or Adam weight_decay"
        )
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    idle = [
        n
        for n, p in (module.named_parameters() if module is not None else ())
        if p.requires_grad and id(p) not in in_opt
    ]
    if idle:
        raise ValueError(
            f"{who}: trainable parameters {idle[:5]} are not in the optimizer (freeze them: requires_grad_(False))"
        )
    lr, wd, momentum, nesterov = next(iter(values))
    return OptimizerRecipe(name, float(lr), float(wd or 0.0), float(momentum or 0.0), bool(nesterov))


def require_plain_sgd(optimizers: list[torch.optim.Optimizer], module: nn.Module | None, who: str) -> OptimizerRecipe:
    """:func:`read_optimizer`, refusing anything but ``torch.optim.SGD`` without momentum or Nesterov.

    Raises:
        ValueError: another optimizer, momentum or Nesterov (the recursion replays ``w - lr (grad + l2 w)``).
    """
    recipe = read_optimizer(optimizers, module, who)
    if recipe.name != "SGD" or recipe.momentum or recipe.nesterov:
        raise ValueError(
            f"{who} follows plain SGD steps: got {recipe.name} with momentum={recipe.momentum}, "
            f"nesterov={recipe.nesterov}; "
            "use torch.optim.SGD(params, lr, weight_decay=l2) with momentum=0"
        )
    return recipe
