"""Recorders for certified unlearning in continual learning (paper 004): task deltas and Hessians."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.functional import certified as cl
from lightning_unlearn.functional import hf


def _clone(H: Any) -> Any:
    return {k: v.clone() for k, v in H.items()} if isinstance(H, dict) else H.clone()


def _proximal_lambda(module: nn.Module) -> float:
    lam = getattr(module, "reg_lambda", None)
    if not lam or not hasattr(module, "anchors") or not hasattr(module, "l2"):
        raise ValueError("paper-004 recorders need a module trained with 004's regulariser (reg_lambda > 0, anchors, l2): use ProximalClassifier")
    return float(lam)


class TaskDeltaRecorder(RecorderCallback):
    """Per experience ``i``: the anchor ``start_i`` (the previous solution the regulariser
    ``(lambda/2)||w - start_i||^2`` of Eq. (1) pulls towards; ``w_0 = 0`` for the first task), the
    solution ``end_i``, the task delta ``Delta_i = start_i - end_i`` (Alg. 2 line 5) and the task size.

    Storage: ``2 d`` floats per experience (``start`` and ``end``; the paper stores ``Delta_t``
    and ``Delta-bar_tau``, d each). Recording the chain of actual starts and ends makes the
    corrections between tasks (Eq. (13)'s ``Delta-bar_tau``) measurable, whatever was published.
    Privacy caveat: ``Delta_s`` of deleted tasks must be kept for later requests.
    Enough for task-level forgetting by :class:`GradientCertifiedStrategy` (which uses only sizes)
    and as the base of :class:`HessianRecorder`.
    """

    #: the task's end is its solution: commit when the fit ends, not after its first epoch
    records_every_epoch = True

    def __init__(self) -> None:
        super().__init__()
        self.experience_ids: list[int] = []
        self.starts: list[Tensor] = []
        self.ends: list[Tensor] = []
        self.sizes: list[int] = []
        self.reg_lambda: float | None = None
        self.l2: float | None = None
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

    def begin_experience(self, module: nn.Module) -> None:
        lam, l2 = _proximal_lambda(module), float(module.l2)
        if (self.reg_lambda, self.l2) not in ((None, None), (lam, l2)):
            raise ValueError(f"module has reg_lambda={lam}, l2={l2} but the recorded tasks used {self.reg_lambda}, {self.l2}")
        self.reg_lambda, self.l2 = lam, l2
        super().begin_experience(module)

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        """Nothing per batch: the task size comes from the staged ids."""

    def _commit(self, module: nn.Module) -> None:
        start = torch.cat([a.detach().reshape(-1) for a in module.anchors()]).clone()
        end = hf.flat_params(module).clone()
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
        missing = [k for k in ("catalog", "experience_ids", "starts", "ends", "sizes", "reg_lambda") if state_dict.get(k) is None]
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


class HessianRecorder(TaskDeltaRecorder):
    """:class:`TaskDeltaRecorder` plus what the Newton-style removal of Alg. 2 needs: at the end of each
    experience, ``H_i = (1/n_i) sum_{z in D_i} hess l(end_i; z)`` (Alg. 2 line 5; ``l`` includes the
    ``l2`` ridge, not 004's regulariser), evaluated at the task's solution.

    ``hessian="exact"`` stores the dense ``d x d`` matrix (``d**2`` floats per task: use up to
    ~1e4 parameters); ``"diagonal"`` stores a Hutchinson estimate ``mean_k z_k * (H z_k)`` with
    ``n_probes`` Rademacher probes, clamped below at ``l2`` [approximation, not in the paper;
    ``d`` floats per task]; ``"lowrank"`` stores the top ``rank`` eigenpairs from Lanczos on HVPs,
    the complement given curvature ``l2`` [approximation, not in the paper; ``rank * d`` floats];
    ``"auto"`` picks exact up to ``max_exact_dim`` parameters, diagonal above.
    The task's samples are held (CPU) only until the end of the experience, to evaluate ``H_i``
    at the solution, then dropped. The recorder also keeps the largest per-sample gradient
    norm and Hessian norm seen at the solutions (estimates of L and M for the certificate)
    and, with ``store_sample_gradients``, each sample's ``grad l(end_i; u)`` by id (``n d``
    floats) so sample-level requests need no data. It logs how exactly each task was solved,
    ``||mean grad l(end_i) + lambda (end_i - start_i)||``, and warns above ``tolerance``.
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
    ) -> None:
        super().__init__()
        if hessian not in ("auto", "exact", "diagonal", "lowrank"):
            raise ValueError(f"hessian must be 'auto', 'exact', 'diagonal' or 'lowrank', got {hessian!r}")
        self.hessian, self.max_exact_dim, self.n_probes, self.rank = hessian, max_exact_dim, n_probes, rank
        self.store_sample_gradients, self.chunk_size, self.seed = store_sample_gradients, chunk_size, seed
        self.hessians: list[Any] = []  # (d, d), (d,) diagonal, or {"values": (k,), "vectors": (d, k)}
        self.stationarity: list[float] = []  # ||grad of Eq. (1) at end_i||: how exactly each task was solved
        self.tolerance = tolerance
        self.lipschitz = 0.0
        self.smoothness = 0.0
        self.sample_grads: dict[int, Tensor] = {}
        self._x: list[Tensor] = []
        self._y: list[Tensor] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(hessian=self.hessian)

    def _drop_staged(self) -> None:
        super()._drop_staged()
        self._x, self._y = [], []

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        if state["ids"].numel():
            raise ValueError(
                "HessianRecorder cannot resume a fit from a checkpoint saved during it: its Hessian needs every input "
                "of the task, and inputs are never saved; fit the experience again from its start"
            )

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        self._x.append(x.detach().cpu())
        self._y.append(y.detach().cpu())

    def _commit(self, module: nn.Module) -> None:
        known = self._fit_experience in self.experience_ids
        if known:
            raise ValueError("HessianRecorder cannot resume an experience mid-fit: its Hessian needs all the task's samples")
        theta = hf.flat_params(module)
        x, y, ids = torch.cat(self._x).to(theta.device), torch.cat(self._y).to(theta.device), torch.cat(self._staged_ids)
        loss = hf.sample_loss_fn(module, self.l2)  # type: ignore[arg-type]
        kind = self.hessian if self.hessian != "auto" else "exact" if theta.numel() <= self.max_exact_dim else "diagonal"
        H = {"exact": self._dense_hessian, "diagonal": self._diagonal_hessian, "lowrank": self._lowrank_hessian}[kind](loss, theta, x, y)
        grad_max, grads, grad_sum = 0.0, {}, torch.zeros_like(theta)
        for k, xb, yb in self._chunks(x, y):
            g = hf.per_sample_grads(loss, theta, xb, yb)
            grad_max = max(grad_max, float(g.norm(dim=1).max()))
            grad_sum += g.sum(0)
            if self.store_sample_gradients:
                grads.update({int(i): gi.cpu() for i, gi in zip(ids[k : k + len(xb)].tolist(), g)})
        anchor = torch.cat([a.detach().reshape(-1) for a in module.anchors()])
        stationarity = float((grad_sum / len(x) + self.reg_lambda * (theta - anchor)).norm())  # type: ignore[operator]
        if stationarity > self.tolerance:
            warnings.warn(f"task {self._fit_experience} is not solved exactly: ||grad of Eq. (1)|| = {stationarity:.3g} > "
                          f"{self.tolerance:g}; 004's identities assume the exact minimiser", stacklevel=2)
        super()._commit(module)
        self.stationarity.append(stationarity)
        self.hessians.append(H if isinstance(H, dict) else H.cpu())
        self.lipschitz = max(self.lipschitz, grad_max)
        top = H["values"] if kind == "lowrank" else torch.linalg.eigvalsh(H) if kind == "exact" else H
        self.smoothness = max(self.smoothness, float(top.abs().max()))
        self.sample_grads.update(grads)

    def _chunks(self, x: Tensor, y: Tensor) -> list[tuple[int, Tensor, Tensor]]:
        """Sample blocks of ``chunk_size`` (bounds the memory of the batched derivatives)."""
        step = self.chunk_size or len(x)
        return [(k, x[k : k + step], y[k : k + step]) for k in range(0, len(x), step)]

    def _dense_hessian(self, loss: hf.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        H = torch.zeros(theta.numel(), theta.numel(), dtype=theta.dtype)
        for _, xb, yb in self._chunks(x, y):
            H += hf.batch_hessian(loss, theta, xb, yb, self.chunk_size) * (len(xb) / len(x))
        return H

    def _diagonal_hessian(self, loss: hf.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        g = torch.Generator().manual_seed(self.seed + len(self.hessians))
        Z = (torch.randint(0, 2, (self.n_probes, theta.numel()), generator=g) * 2 - 1).to(theta.dtype)
        HZ = sum(hf.hvps(loss, theta, xb, yb, Z, chunk_size=8) * (len(xb) / len(x)) for _, xb, yb in self._chunks(x, y))
        return (Z * HZ).mean(0).clamp_min(self.l2)  # type: ignore[arg-type]

    def _lowrank_hessian(self, loss: hf.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        def apply_h(v: Tensor) -> Tensor:
            return sum(hf.hvps(loss, theta, xb, yb, v[None])[0] * (len(xb) / len(x)) for _, xb, yb in self._chunks(x, y))

        g = torch.Generator().manual_seed(self.seed + len(self.hessians))
        values, vectors = cl.lanczos(apply_h, theta.numel(), min(self.rank, theta.numel()), theta.dtype, g)
        return {"values": values.cpu(), "vectors": vectors.cpu()}

    def inverse_solver(self, i: int, lam: float) -> Any:
        """A function applying ``(H_i + lambda I)^{-1}`` (Cholesky for dense ``H_i``)."""
        H = self.hessians[i]
        if isinstance(H, dict):
            return cl.lowrank_inverse(H["values"], H["vectors"], self.l2, lam)  # type: ignore[arg-type]
        if H.ndim == 1:
            return lambda v: v / (H.to(v) + lam)
        chol = torch.linalg.cholesky(H + lam * torch.eye(H.shape[0], dtype=H.dtype))
        return lambda v: torch.cholesky_solve(v.reshape(-1, 1).to(chol), chol).reshape(-1).to(v)

    def require_fitted(self) -> None:
        super().require_fitted()
        if len(self.hessians) != len(self.ends):
            raise ValueError("HessianRecorder has task deltas without Hessians")

    def state_dict(self) -> dict[str, Any]:
        ids = sorted(self.sample_grads)
        return {
            **super().state_dict(),
            "hessians": [_clone(H) for H in self.hessians],
            "stationarity": torch.tensor(self.stationarity, dtype=torch.float64),
            "lipschitz": self.lipschitz,
            "smoothness": self.smoothness,
            "sample_grad_ids": torch.tensor(ids, dtype=torch.long),
            "sample_grads": torch.stack([self.sample_grads[i] for i in ids]) if ids else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("hessians") is None or len(state_dict["hessians"]) != len(state_dict.get("ends") or []):
            raise ValueError("HessianRecorder state lacks recorded Hessians (one per experience)")
        super().load_state_dict(state_dict)
        self.hessians = [_clone(H) for H in state_dict["hessians"]]
        self.stationarity = state_dict["stationarity"].tolist()
        self.lipschitz, self.smoothness = float(state_dict["lipschitz"]), float(state_dict["smoothness"])
        grads = state_dict.get("sample_grads")
        self.sample_grads = {} if grads is None else dict(zip(state_dict["sample_grad_ids"].tolist(), grads.clone()))
