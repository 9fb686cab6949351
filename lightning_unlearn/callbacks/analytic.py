"""`AnalyticRecorder`: records what ACU needs while an analytic head learns a stream of experiences."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.functional import acu


class AnalyticRecorder(RecorderCallback):
    """Accumulates ``R = sum f^T f`` and ``Q = sum f^T y`` (float64) and keeps the ridge head.

    Works with any module that has ``features(x) -> (n, d_F)`` (frozen backbone + expansion G,
    eq. 1) and a bias-free ``head: nn.Linear(d_F, d_C)``; :class:`AnalyticClassifier` is one.
    If the module's ``training_step`` returns ``{"features": f}`` they are reused, otherwise the
    recorder calls ``module.features``. No input is ever stored: after each experience the
    recorder solves eq. (3)/(4) for ``W`` and ``T`` and writes ``W`` into ``module.head``.

    Args:
        ridge: the ridge regulariser, ``gamma`` of eq. (2).
        dtype: dtype of the statistics (float64 is what makes forgetting exact to ~1e-12).
    """

    def __init__(self, ridge: float = 1.0, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        if ridge <= 0:
            raise ValueError(f"AnalyticRecorder ridge must be positive, got {ridge}")
        self.ridge = float(ridge)
        self.dtype = dtype
        self.R: Tensor | None = None  # sum f^T f over learned, not-forgotten samples
        self.Q: Tensor | None = None  # sum f^T y
        self.T: Tensor | None = None  # knowledge tracking matrix, eq. (4) then eq. (5)
        self.W: Tensor | None = None  # analytic head, eq. (3) then eq. (6)
        self._dR: Tensor | None = None
        self._dQ: Tensor | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(ridge=self.ridge)

    @staticmethod
    def head_of(module: nn.Module) -> nn.Linear:
        head = getattr(module, "head", None)
        if not isinstance(head, nn.Linear) or head.bias is not None or not hasattr(module, "features"):
            raise ValueError(
                "ACU needs a module with features(x) and a bias-free nn.Linear `head` "
                "(e.g. lightning_unlearn.AnalyticClassifier)"
            )
        return head

    def head_name(self, module: nn.Module) -> str:
        """``state_dict`` name of the head's weight (``W^T``, as ``nn.Linear`` stores it)."""
        head = self.head_of(module)
        return next(n for n, p in module.named_parameters() if p is head.weight)

    def features(self, module: nn.Module, x: Tensor) -> Tensor:
        with torch.no_grad():
            return module.features(x).to(self.dtype)

    def begin_experience(self, module: nn.Module) -> None:
        head = self.head_of(module)
        trainable = [n for n, p in module.named_parameters() if p.requires_grad and not n.startswith("head.")]
        if trainable:
            raise ValueError(f"ACU needs a frozen backbone, but these parameters are trainable: {trainable[:5]}")
        d_F, d_C = head.in_features, head.out_features
        if self.R is None:
            self.R = torch.zeros(d_F, d_F, dtype=self.dtype)
            self.Q = torch.zeros(d_F, d_C, dtype=self.dtype)
        elif self.R.shape[0] != d_F or self.Q.shape[1] != d_C:
            raise ValueError(f"module head is {d_F}x{d_C} but the recorded statistics are {tuple(self.Q.shape)}")
        super().begin_experience(module)

    def _drop_staged(self) -> None:
        super()._drop_staged()
        self._dR = self._dQ = None

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        f = outputs.get("features") if isinstance(outputs, dict) else None
        F = (f.detach() if f is not None else self.features(module, x)).to(self.dtype).cpu()
        Y = acu.one_hot(y.cpu(), self.Q.shape[1], self.dtype)
        if self._dR is None:
            self._dR, self._dQ = torch.zeros_like(self.R), torch.zeros_like(self.Q)
        self._dR, self._dQ = acu.accumulate(self._dR, self._dQ, F, Y)

    def _commit(self, module: nn.Module) -> None:
        R, Q = self.R + self._dR, self.Q + self._dQ
        T, W = acu.ridge_solution(R, Q, self.ridge)
        self.R, self.Q, self.T, self.W = R, Q, T, W
        self.write_head(module)

    def write_head(self, module: nn.Module) -> None:
        """Copy ``W`` into ``module.head`` (an ``nn.Linear`` stores ``W^T``)."""
        head = self.head_of(module)
        with torch.no_grad():
            head.weight.copy_(self.W.T.to(head.weight))

    def state_dict(self) -> dict[str, Any]:
        stats = {k: getattr(self, k) for k in ("R", "Q", "T", "W")}
        return {**super().state_dict(), "ridge": self.ridge, **{k: v.clone() if v is not None else None for k, v in stats.items()}}

    def _staged_state(self) -> dict[str, Any]:
        return {"dR": self._dR, "dQ": self._dQ}

    def _load_staged_state(self, state: dict[str, Any]) -> None:
        self._dR, self._dQ = state.get("dR"), state.get("dQ")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # saved during the first fit, before its first commit: no solution W, T yet
        first_fit = state_dict.get("fit") is not None and not len((state_dict.get("catalog") or {}).get("ids", ()))
        needed = ("catalog", "R", "Q") if first_fit else ("catalog", "R", "Q", "T", "W")
        missing = [k for k in needed if state_dict.get(k) is None]
        if missing:
            raise ValueError(f"AnalyticRecorder state lacks recorded statistics {missing}")
        if float(state_dict["ridge"]) != self.ridge:
            raise ValueError(f"checkpoint was recorded with ridge={state_dict['ridge']}, this recorder has {self.ridge}")
        super().load_state_dict(state_dict)
        self.R, self.Q, self.T, self.W = (None if state_dict[k] is None else state_dict[k].clone() for k in "RQTW")
