"""WoodFisher influence unlearning, pure torch ([WoodFisher]: Singh & Alistarh, *WoodFisher: Efficient
Second-Order Approximation for Neural Network Compression*; used for unlearning by [Sparse]).

The Hessian of the retained loss is approximated by the dampened empirical Fisher of ``N`` per-sample
retained gradients ``g_1, ..., g_N``,

    F = lambda I + (1/N) sum_k g_k g_k^T,

whose inverse [WoodFisher] builds by ``N`` Sherman-Morrison (rank-one Woodbury) updates from
``F_0^{-1} = I / lambda``:

    F_k^{-1} = F_{k-1}^{-1} - (F_{k-1}^{-1} g_k)(F_{k-1}^{-1} g_k)^T / (N + g_k^T F_{k-1}^{-1} g_k).

:func:`woodfisher_inverse_product` applies ``F_N^{-1}`` to a vector without forming a ``d x d``
matrix: it keeps ``u_k = F_{k-1}^{-1} g_k`` (``O(N d)`` memory, ``O(N^2 d)`` time), exactly. [interp]
The unlearning code of [Sparse] (``unlearn/Wfisher.py``, ``woodfisher``) keeps a single vector
instead, which applies the exact recursion only when the gradients are parallel; this module
applies it exactly. The update itself is :func:`influence_direction` (the authors' scaling) times a
step ``alpha``: ``w <- w + alpha F^{-1} v``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def woodfisher_inverse_product(
    gradients: Tensor, v: Tensor, dampening: float = 1.0, *, overwrite: bool = False
) -> Tensor:
    """``F^{-1} v`` for ``F = dampening I + (1/N) sum_k g_k g_k^T`` by the Sherman-Morrison recursion.

    Args:
        gradients: ``(N, d)``, one per-sample gradient per row (``N >= 1``).
        v: ``(d,)``, the vector to precondition.
        dampening: ``lambda > 0`` (the authors' code starts the recursion from the identity: 1).
        overwrite: store ``u_k`` in row ``k`` of ``gradients`` (each row is read once, before it is
            replaced), halving the memory; ``gradients`` is then garbage.

    Returns:
        ``(d,)``, in the dtype of ``gradients`` and ``v`` (give float64 for an exact inverse).

    Raises:
        ValueError: shapes that do not match, no gradient, or ``dampening <= 0``.
    """
    if not dampening > 0:
        raise ValueError(f"the Fisher's dampening lambda must be > 0, got {dampening}")
    if gradients.ndim != 2 or v.ndim != 1 or gradients.shape[1] != v.shape[0]:
        raise ValueError(f"gradients must be (N, d) and v (d,), got {tuple(gradients.shape)} and {tuple(v.shape)}")
    n = gradients.shape[0]
    if n == 0:
        raise ValueError("the empirical Fisher needs at least one per-sample gradient")
    u = gradients if overwrite else torch.empty_like(gradients)  # u_k = F_{k-1}^{-1} g_k
    denominators = torch.empty(n, dtype=gradients.dtype, device=gradients.device)
    for k in range(n):
        g = gradients[k].clone() if overwrite else gradients[k]
        u[k] = g / dampening - u[:k].T @ ((u[:k] @ g) / denominators[:k])
        denominators[k] = n + g @ u[k]
    return v / dampening - u.T @ ((u @ v) / denominators)


def influence_direction(forget_mean: Tensor, retain_mean: Tensor, n_forget: int, n_retain: int) -> Tensor:
    """The vector ``v`` that [Sparse]'s WoodFisher unlearning preconditions (``unlearn/Wfisher.py``, ``Wfisher``).

    ``v = (n_f / n) (mean forget gradient - mean retained gradient)`` with ``n = n_f + n_r``.
    [derived] At a minimiser of the full training loss ``n_f g_f + n_r g_r = 0``, so ``v = -g_r``:
    ``w + F^{-1} v`` is then a Newton step on the retained loss with the Fisher for its Hessian
    (the influence-function estimate of the retrained model), and ``alpha = 1`` takes it whole.

    Raises:
        ValueError: ``n_forget < 1`` or ``n_retain < 1``, or the gradients' shapes differ.
    """
    if n_forget < 1 or n_retain < 1:
        raise ValueError(f"the influence direction needs forget and retained samples, got {n_forget} and {n_retain}")
    if forget_mean.shape != retain_mean.shape:
        raise ValueError(f"gradient shapes differ: {tuple(forget_mean.shape)} and {tuple(retain_mean.shape)}")
    return n_forget / (n_forget + n_retain) * (forget_mean - retain_mean)
