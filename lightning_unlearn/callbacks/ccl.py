"""Recorders for certified unlearning in continual learning ([CCL]): task deltas and Hessians."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lightning_unlearn import contract
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.functional import autodiff, ccl, newton
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.progress import status
from lightning_unlearn.regularization import ProximalRegularizer
from lightning_unlearn.warnings import warn

#: power iterations for the largest |eigenvalue| of a dense task Hessian (the recorder's estimated smoothness M)
POWER_ITERS = 100
#: Lanczos steps for the largest eigenvalue of a factored task Hessian
LANCZOS_STEPS = 32
#: the forms a :class:`CCLHessianRecorder` stores a task Hessian in
KINDS = ("auto", "exact", "factored", "diagonal", "lowrank")


def _clone(H: Any) -> Any:
    return {k: v.clone() for k, v in H.items()} if isinstance(H, dict) else H.clone()


class CCLRecorder(RecorderCallback):
    """Per experience ``i``: the anchor ``start_i`` (the previous solution the regulariser
    ``(lambda/2)||w - start_i||^2`` of [CCL] Eq. (1) pulls towards; ``w_0 = 0`` for the first task), the
    solution ``end_i``, the task delta ``Delta_i = start_i - end_i`` (Alg. 2 line 5) and the task size.

    Works on any module trained with a :class:`ProximalRegularizer` (given as ``regularizer``, or found
    among the Trainer's callbacks, e.g. handed over by :class:`ProximalClassifier`). The per-sample loss
    is ``l = loss_fn(module(x), y) + (mu/2)||w||^2`` with ``mu`` = the optimizer's ``weight_decay`` plus
    the regulariser's ``ridge`` (:mod:`lightning_unlearn.contract`), checked at fit start against the
    module's own training loss on its first batch.

    Storage: ``2 d`` floats per experience (``start`` and ``end``; the paper stores ``Delta_t``
    and ``Delta-bar_tau``, d each), on the module's device (CPU with ``offload=True``). Recording the
    chain of actual starts and ends makes the corrections between tasks (Eq. (13)'s ``Delta-bar_tau``)
    measurable, whatever was published. Privacy caveat: ``Delta_s`` of deleted tasks must be kept
    for later requests. Enough for task-level forgetting by :class:`CCLGradientUnlearner` (which
    uses only sizes) and as the base of :class:`CCLHessianRecorder`.

    Other training loops (Avalanche) call :meth:`read_optimizer` and pass ``regularizer`` explicitly.

    Args:
        loss_fn: ``loss_fn(outputs, targets) -> (n,)`` per-sample loss (default: cross-entropy).
        regularizer: the :class:`ProximalRegularizer` the module is trained with (default: the one among
            the Trainer's callbacks).
        offload: keep the statistics on the CPU instead of the module's device.

    Raises:
        ValueError: at fit start, no (or several) regularizer, a regulariser or ridge different from the
            recorded tasks', an unsupported optimizer, or a training loss that is not ``loss_fn``'s.
    """

    #: the task's end is its solution: commit when the fit ends, not after its first epoch
    records_every_epoch = True
    records_parameters = True
    checks_loss_on_first_batch = True
    #: under DDP only ids, labels and fingerprints are gathered (the task size counts them)
    gathers_inputs = False

    def __init__(
        self,
        loss_fn: contract.LossFn | None = None,
        regularizer: ProximalRegularizer | None = None,
        offload: bool = False,
    ) -> None:
        super().__init__()
        self.loss_fn: contract.LossFn = loss_fn or contract.per_sample_cross_entropy
        self.regularizer, self.offload = regularizer, offload
        self.experience_ids: list[int] = []
        self.starts: list[Tensor] = []
        self.ends: list[Tensor] = []
        self.sizes: list[int] = []
        self.reg_lambda: float | None = None
        self.l2: float | None = None
        self.weight_decay: float | None = None
        self.forgotten_grad_sums: list[Tensor | None] = []  # sum of grad l(end_i; u) over forgotten u of task i

    @property
    def state_key(self) -> str:
        return self._generate_state_key()

    @property
    def deltas(self) -> list[Tensor]:
        """``Delta_i = start_i - end_i`` (Alg. 2 line 5)."""
        return [s - e for s, e in zip(self.starts, self.ends)]

    def task_index(self, experience: int) -> int:
        return self.experience_ids.index(experience)

    def module_loss(self, module: nn.Module) -> autodiff.ModuleLoss:
        """[CCL]'s per-sample loss ``l`` of ``module`` (``loss_fn`` plus the ridge ``mu = l2``)."""
        return autodiff.ModuleLoss(module, float(self.l2 or 0.0), self.loss_fn)

    def _device(self, module: nn.Module) -> torch.device:
        return torch.device("cpu") if self.offload else autodiff.flat_params(module).device

    # -- the contract: regulariser, optimizer, loss ---------------------------------------------------
    def read_optimizer(self, optimizers: list[torch.optim.Optimizer], module: nn.Module) -> None:
        """Take the ridge from the optimizer's ``weight_decay`` (see :func:`contract.read_optimizer`)."""
        self.weight_decay = contract.read_optimizer(optimizers, module, type(self).__name__).weight_decay

    def begin_experience(self, module: nn.Module) -> None:
        if self.regularizer is None and isinstance(module, L.LightningModule):  # e.g. ProximalClassifier's own
            configured = module.configure_callbacks() or ()
            configured = [configured] if isinstance(configured, L.Callback) else configured
            own = [c for c in configured if isinstance(c, ProximalRegularizer)]
            self.regularizer = own[0] if len(own) == 1 else None
        reg = self.regularizer
        if reg is None:
            raise ValueError(
                f"{type(self).__name__} needs [CCL]'s proximal regulariser (Eq. (1)): "
                "add a ProximalRegularizer(reg_lambda) "
                "callback (or pass regularizer=...), or use ProximalClassifier"
            )
        lam, l2 = reg.reg_lambda, reg.ridge + (self.weight_decay or 0.0)
        if (self.reg_lambda, self.l2) not in ((None, None), (lam, l2)):
            raise ValueError(
                f"the fit has reg_lambda={lam}, l2={l2} but the recorded tasks used {self.reg_lambda}, {self.l2}"
            )
        self.reg_lambda, self.l2 = lam, l2
        reg.begin_experience(module)
        super().begin_experience(module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        found = [c for c in trainer.callbacks if isinstance(c, ProximalRegularizer)]  # type: ignore[attr-defined]
        if self.regularizer is None and len(found) > 1:
            raise ValueError(
                f"{type(self).__name__} found {len(found)} ProximalRegularizer callbacks: pass regularizer=..."
            )
        if self.regularizer is None and found:
            self.regularizer = found[0]
        self.read_optimizer(trainer.optimizers, pl_module)
        super().on_train_start(trainer, pl_module)

    def loss_penalty(self, trainer: L.Trainer) -> Callable[[nn.Module], Tensor] | None:
        """The penalty of :attr:`regularizer` if the module adds it to its loss (``in_loss``)."""
        reg = self.regularizer
        return reg.penalty if reg is not None and reg.in_loss else None

    # -- recording ---------------------------------------------------------------------------------
    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        """Nothing per batch: the task size comes from the staged ids."""

    def _commit(self, module: nn.Module) -> None:
        device = self._device(module)
        if self.regularizer is None:
            raise RuntimeError(f"{type(self).__name__} committed an experience that begin_experience did not set up")
        start = self.regularizer.anchor_vector(module).detach().clone().to(device)
        end = autodiff.flat_params(module).clone().to(device)
        n = int(sum(t.numel() for t in self._staged_ids))
        if self._fit_experience in self.experience_ids:  # a fit resumed within this experience
            i = self.task_index(self._fit_experience)
            self.ends[i], self.sizes[i] = end, self.sizes[i] + n
            return
        self.experience_ids.append(self._fit_experience)
        self.starts.append(start)
        self.ends.append(end)
        self.sizes.append(n)
        self.forgotten_grad_sums.append(None)

    def require_fitted(self) -> None:
        super().require_fitted()
        if not self.ends:
            raise ValueError(f"{type(self).__name__} holds no task deltas")

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "experience_ids": torch.tensor(self.experience_ids, dtype=torch.long),
            "starts": [s.clone() for s in self.starts],
            "ends": [e.clone() for e in self.ends],
            "sizes": torch.tensor(self.sizes, dtype=torch.long),
            "reg_lambda": self.reg_lambda,
            "l2": self.l2,
            "forgotten_grad_sums": [None if g is None else g.clone() for g in self.forgotten_grad_sums],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        missing = [
            k
            for k in ("catalog", "experience_ids", "starts", "ends", "sizes", "reg_lambda")
            if state_dict.get(k) is None
        ]
        if missing:
            raise ValueError(f"{type(self).__name__} state lacks recorded statistics {missing}")
        k = state_dict["experience_ids"].numel()
        if not len(state_dict["starts"]) == len(state_dict["ends"]) == state_dict["sizes"].numel() == k:
            raise ValueError(f"inconsistent {type(self).__name__} state: {k} experiences but mismatched task lists")
        super().load_state_dict(state_dict)
        self.experience_ids = state_dict["experience_ids"].tolist()
        self.starts = [s.clone() for s in state_dict["starts"]]
        self.ends = [e.clone() for e in state_dict["ends"]]
        self.sizes = state_dict["sizes"].tolist()
        self.reg_lambda, self.l2 = float(state_dict["reg_lambda"]), float(state_dict["l2"])
        self.forgotten_grad_sums = [None if g is None else g.clone() for g in state_dict["forgotten_grad_sums"]]


class CCLHessianRecorder(CCLRecorder):
    """:class:`CCLRecorder` plus what the Newton-style removal of [CCL] Alg. 2 needs: at the end of each
    experience, ``H_i = (1/n_i) sum_{z in D_i} hess l(end_i; z)`` (Alg. 2 line 5; ``l`` includes the
    ridge ``mu``, not Eq. (1)'s regulariser), evaluated at the task's solution, module in eval mode.

    ``hessian`` chooses how ``H_i`` is stored: ``"exact"`` (dense, ``d^2`` floats per task), ``"factored"`` (the
    Gauss-Newton factor ``F`` with ``H_i = F^T F + mu I``, exact for a module affine in its parameters),
    ``"diagonal"`` (Hutchinson) and ``"lowrank"`` (Lanczos), both approximations not in the paper, or ``"auto"``.
    The task's samples are held only until the end of the experience, then dropped; with
    ``store_sample_gradients`` each sample's ``grad l(end_i; u)`` is kept by id, so sample-level requests need no
    data. It warns when a task was not solved exactly (``stationarity`` above ``tolerance``). The forms' costs, the
    estimates of L and M, and the DDP sums: ``docs/methods/ccl.md``, "Recording".

    **Under DDP the per-sample rows are sharded** (``docs/scale.md``): each rank keeps the factor rows
    (``"factored"``) and the stored gradients of the samples it computed (about ``n/R``); every product with ``F`` and
    a request's gradient sum is this rank's sum all-reduced, so every rank runs the same solve and holds the same
    model. :meth:`state_dict` gathers every row on rank 0; loading keeps the rows ``i % R == rank``.

    Args:
        hessian: ``"auto"``, ``"exact"``, ``"factored"``, ``"diagonal"`` or ``"lowrank"``.
        max_exact_dim: largest ``d`` for which ``"auto"`` stores the dense Hessian.
        n_probes: Hutchinson probes (``"diagonal"``).
        rank: Lanczos steps (``"lowrank"``).
        store_sample_gradients: keep ``grad l(end_i; u)`` of every sample.
        chunk_size: samples per batched derivative call (bounds peak memory).
        seed: seed of the probes / the Lanczos start vector.
        tolerance: stationarity above which a warning says the task was not solved exactly.
        loss_fn, regularizer, offload: as :class:`CCLRecorder`.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import CCLHessianRecorder, IndexedDataset, ProximalClassifier
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model = ProximalClassifier(torch.nn.Linear(4, 3), l2=0.1, reg_lambda=1.0, optimizer="lbfgs",
        ...                            newton_tolerance=1e-6)  # each task solved: [CCL] assumes the minimiser
        >>> recorder = CCLHessianRecorder(hessian="exact")
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=32))
        >>> tuple(recorder.hessians[0].shape), recorder.stationarity[0] <= recorder.tolerance  # d = 4 x 3 + 3
        ((15, 15), True)
    """

    def __init__(
        self,
        hessian: str = "auto",
        max_exact_dim: int = 10_000,
        n_probes: int = 64,
        rank: int = 32,
        store_sample_gradients: bool = False,
        chunk_size: int | None = 256,
        seed: int = 0,
        tolerance: float = 1e-3,
        loss_fn: contract.LossFn | None = None,
        regularizer: ProximalRegularizer | None = None,
        offload: bool = False,
    ) -> None:
        super().__init__(loss_fn, regularizer, offload)
        if hessian not in KINDS:
            raise ValueError(f"hessian must be one of {KINDS}, got {hessian!r}")
        self.hessian, self.max_exact_dim, self.n_probes, self.rank = hessian, max_exact_dim, n_probes, rank
        self.store_sample_gradients, self.chunk_size, self.seed = store_sample_gradients, chunk_size, seed
        self.hessians: list[Any] = []  # (d, d), (d,) diagonal, or {"values": (k,), "vectors": (d, k)}
        self.stationarity: list[float] = []  # ||grad of Eq. (1) at end_i||: how exactly each task was solved
        self.tolerance = tolerance
        self.lipschitz = 0.0
        self.smoothness = 0.0
        self.sample_grads: dict[int, Tensor] = {}
        self._x: list[Tensor] = []  # this rank's inputs of the task (all of them in one process)
        self._y: list[Tensor] = []
        self._shard_ids: list[Tensor] = []  # their ids

    @property
    def state_key(self) -> str:
        return self._generate_state_key(hessian=self.hessian)

    def _drop_staged(self) -> None:
        super()._drop_staged()
        self._x, self._y, self._shard_ids = [], [], []

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        if state["ids"].numel():
            raise ValueError(
                "CCLHessianRecorder cannot resume a fit from a checkpoint saved during it: its Hessian needs every "
                "input of the task, and inputs are never saved; fit the experience again from its start"
            )

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        device = self._device(module)
        self._x.append(x.detach().to(device))
        self._y.append(y.detach().to(device))
        self._shard_ids.append(ids.detach().cpu())

    def _commit(self, module: nn.Module) -> None:
        if self._fit_experience in self.experience_ids:
            raise ValueError(
                "CCLHessianRecorder cannot resume an experience mid-fit: its Hessian needs all the task's samples"
            )
        reg, lam, l2 = self.regularizer, self.reg_lambda, self.l2
        if reg is None or lam is None or l2 is None:
            raise RuntimeError(f"{type(self).__name__} committed an experience that begin_experience did not set up")
        theta = autodiff.flat_params(module)
        empty = theta.new_zeros(0)
        x = torch.cat(self._x).to(theta.device) if self._x else empty
        y = torch.cat(self._y).to(theta.device) if self._y else empty.long()
        n = int(sum(t.numel() for t in self._staged_ids))  # over all ranks
        share = len(x) / n  # this rank's weight n_r / n in the mean Hessian
        loss, d = self.module_loss(module), theta.numel()
        g = torch.Generator().manual_seed(self.seed + len(self.hessians))  # the same probes on every rank
        H: Any
        with eval_mode(module):  # the Hessian of a per-sample loss: BatchNorm statistics fixed
            factor = self._factor(module, loss, theta, x, y, n)
            if self.hessian == "auto" and self.max_over_ranks(0.0 if factor is not None else 1.0) > 0:
                factor = None  # some rank's module is not affine: every rank stores the same form
            kind = self.hessian if self.hessian != "auto" else "exact" if d <= self.max_exact_dim else "diagonal"
            kind = "factored" if factor is not None else kind
            status(f"CCLHessianRecorder: task {self._fit_experience}: {kind} Hessian over {n} samples, {d} parameters")
            if factor is not None:  # this rank's rows only: F^T F v is their product summed over the ranks
                apply_factored = ccl.gauss_newton_operator(factor, float(l2), self.shards)
                # the top of the spectrum by Lanczos (a lower bound, converging much faster than the
                # power iteration: LANCZOS_STEPS products instead of POWER_ITERS)
                values, _ = ccl.lanczos(apply_factored, d, min(LANCZOS_STEPS, d), theta.dtype, g, theta.device)
                top = float(values.max())
                f64 = torch.float64  # the scalars exactly (float32 would round l2 = 0.05)
                H = {"factor": factor, "ridge": torch.tensor(float(l2), dtype=f64), "top": torch.tensor(top, dtype=f64)}
            elif kind == "exact":
                # the mean over this rank's rows, by the Gauss-Newton product when the module is affine in theta
                # (NewtonRecorder's; ~7x fewer flops than d HVPs for a linear softmax), else by HVPs
                H = newton.hessian_sum(loss, theta, x, y, self.chunk_size).div_(max(len(x), 1))
                H = self.sum_over_ranks(H * share)
                # |lambda_max| by power iteration, O(d^2) per step as NewtonRecorder's; never above the true value
                # (a full eigvalsh is O(d^3): over 10 minutes per task at d = 7,850, MNIST's linear model, here)
                top, _ = autodiff.top_eigenvalue(lambda v: H @ v, torch.ones_like(theta), POWER_ITERS)
            else:
                local = ccl.hessian_operator(loss, theta, x, y, self.chunk_size) if len(x) else torch.zeros_like

                def apply_h(V: Tensor) -> Tensor:
                    return self.sum_over_ranks(local(V) * share)

                if kind == "diagonal":
                    H = ccl.hutchinson_diagonal(apply_h, d, self.n_probes, float(l2), g, theta.dtype, theta.device)
                    top = float(H.abs().max())
                else:
                    values, vectors = ccl.lanczos(
                        lambda v: apply_h(v[None])[0], d, min(self.rank, d), theta.dtype, g, theta.device
                    )
                    H, top = {"values": values, "vectors": vectors}, float(values.abs().max())
            grad_max, grad_rows, grad_sum = 0.0, [], torch.zeros_like(theta)
            step = self.chunk_size or max(len(x), 1)
            for k in range(0, len(x), step):
                xb, yb = x[k : k + step], y[k : k + step]
                gb = autodiff.per_sample_grads(loss, theta, xb, yb)
                grad_max = max(grad_max, float(gb.norm(dim=1).max()))
                grad_sum += gb.sum(0)
                if self.store_sample_gradients:
                    grad_rows.append(gb.to(self._device(module)))
        grad_sum, grad_max = self.sum_over_ranks(grad_sum), self.max_over_ranks(grad_max)
        grads: dict[int, Tensor] = {}
        if self.store_sample_gradients and grad_rows:  # this rank's samples only
            grads = dict(zip(torch.cat(self._shard_ids).tolist(), torch.cat(grad_rows)))
        anchor = reg.anchor_vector(module).to(theta)
        stationarity = float((grad_sum / n + lam * (theta - anchor)).norm())
        if stationarity > self.tolerance:
            warn(
                f"task {self._fit_experience} is not solved exactly: ||grad of Eq. (1)|| = {stationarity:.3g} > "
                f"{self.tolerance:g}; [CCL]'s identities assume the exact minimiser (not repeated for later tasks; "
                "every task's value is in the recorder's `stationarity`)",
                cause=("task not solved exactly", type(self).__name__, self.tolerance),
            )
        super()._commit(module)
        self.stationarity.append(stationarity)
        device = self._device(module)
        self.hessians.append({k: v.to(device) for k, v in H.items()} if isinstance(H, dict) else H.to(device))
        self.lipschitz = max(self.lipschitz, grad_max)
        self.smoothness = max(self.smoothness, top)
        self.sample_grads.update(grads)

    def _factor(
        self, module: nn.Module, loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, n: int
    ) -> Tensor | None:
        """This rank's rows of the task's factor ``F`` (``H_i = F^T F + mu I``) when the Hessian is stored
        factored (``"factored"``, or ``"auto"`` with ``n K < d``), else ``None``; one probe of the module's
        affinity (:func:`newton.gauss_newton_factor`) per chunk of ``chunk_size`` samples.

        Raises:
            ValueError: ``hessian="factored"`` on a module whose output is not affine in its parameters (or whose
                loss is not convex in the outputs).
        """
        if self.hessian not in ("auto", "factored"):
            return None
        d = theta.numel()
        outputs = int(module(x[:1]).numel()) if len(x) else 0
        if self.hessian == "auto" and not n * outputs < d:
            return None
        step = self.chunk_size or max(len(x), 1)
        parts = []
        for k in range(0, len(x), step):
            part = newton.gauss_newton_factor(loss, theta, x[k : k + step], y[k : k + step])
            if part is None:
                if self.hessian == "auto":
                    return None
                raise ValueError(
                    "CCLHessianRecorder(hessian='factored') needs a module whose output is affine in its trainable "
                    "parameters (e.g. a linear head on a frozen backbone) and a loss convex in the outputs: use "
                    "'exact', 'diagonal' or 'lowrank'"
                )
            parts.append(part)
        return torch.cat(parts).div_(n**0.5) if parts else theta.new_zeros(0, d)

    def require_fitted(self) -> None:
        super().require_fitted()
        if len(self.hessians) != len(self.ends):
            raise ValueError("CCLHessianRecorder has task deltas without Hessians")

    # -- the rows this rank holds ---------------------------------------------------------------------
    @property
    def shards(self) -> ccl.Shards:
        """The collectives over the factor rows the ranks hold (:meth:`sum_over_ranks`, :meth:`gather_over_ranks`;
        in one process every row is here), for :func:`ccl.inverse_solver`."""
        return ccl.Shards(self.sum_over_ranks, self.gather_over_ranks)

    def missing_sample_gradients(self, ids: Tensor) -> list[int]:
        """The ``ids`` whose gradient no rank stores (one all-reduce of a count per id: every rank calls it).

        Raises:
            ValueError: some ids' gradients are stored by more than one rank (the rows and the catalog disagree).
        """
        held = [float(u in self.sample_grads) for u in ids.tolist()]
        counts = self.sum_over_ranks(torch.tensor(held, dtype=torch.float64)).round().long()
        twice = ids[counts > 1].tolist()
        if twice:
            raise ValueError(
                f"CCLHessianRecorder holds the gradients of samples {twice[:10]} on more than one rank: its rows and "
                "its catalog disagree"
            )
        return ids[counts == 0].tolist()

    def sample_gradient_sum(self, ids: Tensor) -> Tensor:
        """``sum_{u in ids} grad l(end_i; u)`` of the stored gradients: each rank adds those it holds, one all-reduce
        adds the ranks' sums (every rank calls it; :meth:`missing_sample_gradients` checks that each is held once)."""
        held = [self.sample_grads[u] for u in ids.tolist() if u in self.sample_grads]
        return self.sum_over_ranks(torch.stack(held).sum(0) if held else torch.zeros_like(self.ends[-1]))

    # -- state ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The recorded tasks, with every rank's factor rows and stored gradients: under DDP they are gathered on
        rank 0 (a collective: Lightning builds the checkpoint on every rank and writes rank 0's); another rank's state
        holds its own only, marked ``row_shard = [rank, R]``, and is not loadable alone."""
        hessians = [_clone(H) for H in self.hessians]
        ids = torch.tensor(sorted(self.sample_grads), dtype=torch.long)
        d = self.ends[-1].numel() if self.ends else 0
        grads = torch.stack([self.sample_grads[i] for i in ids.tolist()]) if len(ids) else None
        shard = [0, 1]
        if self._strategy is not None and self.ends:  # the ranks commit their tasks together
            for H in hessians:
                if isinstance(H, dict) and "factor" in H:
                    H["factor"] = self.gather_to_rank0(H["factor"])
            ids = self.gather_to_rank0(ids)
            rows = self.gather_to_rank0(grads if grads is not None else self.ends[-1].new_zeros(0, d))
            order = ids.argsort()
            ids, grads = ids[order], (rows[order] if len(ids) else None)
            shard = self._row_shard()
        return {
            **super().state_dict(),
            "hessians": hessians,
            "stationarity": torch.tensor(self.stationarity, dtype=torch.float64),
            "lipschitz": self.lipschitz,
            "smoothness": self.smoothness,
            "sample_grad_ids": ids,
            "sample_grads": grads,
            "row_shard": shard,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the recorded tasks. The state holds every factor row and stored gradient; under torch.distributed
        (a DDP fit restoring a checkpoint, or a process group of a script) each process keeps the rows and gradients
        ``i % R == rank`` and joins the group (:meth:`join_process_group`), whatever the number of processes that
        saved it.

        Raises:
            ValueError: the state lacks a Hessian per task, or is another rank's part of a DDP state. Nothing is
                changed.
        """
        if state_dict.get("hessians") is None or len(state_dict["hessians"]) != len(state_dict.get("ends") or []):
            raise ValueError("CCLHessianRecorder state lacks recorded Hessians (one per experience)")
        self._refuse_row_shard(state_dict)
        super().load_state_dict(state_dict)
        self._join_loaded_group()
        self.hessians = [_clone(H) for H in state_dict["hessians"]]
        for H in self.hessians:
            if isinstance(H, dict) and "factor" in H:
                H["factor"] = H["factor"][self._share(len(H["factor"]))]
        self.stationarity = state_dict["stationarity"].tolist()
        self.lipschitz, self.smoothness = float(state_dict["lipschitz"]), float(state_dict["smoothness"])
        grads, self.sample_grads = state_dict.get("sample_grads"), {}
        if grads is not None:
            mine = self._share(len(grads))
            self.sample_grads = dict(zip(state_dict["sample_grad_ids"][mine].tolist(), grads[mine]))
