"""SCRUB's distillation objective, pure torch ([SCRUB]: Kurmanji et al., *Towards Unbounded Machine Unlearning*).

The student ``w^u`` starts at the original model ``w^o`` (the frozen teacher) and alternates

* max-steps on the forget set: minimise ``-d(x_f; w^o, w^u)`` (move away from the teacher), and
* min-steps on the retained set: minimise ``alpha d(x_r; w^o, w^u) + gamma l(f(x_r; w^u), y_r)``,

the two halves of [SCRUB]'s objective, with ``d`` the temperature-scaled KL divergence
of the teacher's from the student's output distribution (:func:`distill_kl`, the authors'
``DistillKL`` of ``thirdparty/repdistiller/distiller_zoo/KD.py``). SCRUB+R's rewinding picks the
checkpoint whose forget-set error is closest to a held-out reference error (:func:`rewind_index`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def distill_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """``d = T^2 KL(softmax(z_t / T) || softmax(z_s / T))``, summed over classes, averaged over the batch.

    Args:
        student_logits: ``(n, C)`` logits of the student (differentiable).
        teacher_logits: ``(n, C)`` logits of the frozen teacher.
        temperature: ``T > 0`` (the authors use 4, and 2 in their small-scale runs).

    Raises:
        ValueError: ``T <= 0``, or the logits' shapes differ or are not ``(n, C)``.
    """
    if not temperature > 0:
        raise ValueError(f"the distillation temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape or student_logits.ndim != 2:
        raise ValueError(
            f"student and teacher logits must both be (n, C), got {tuple(student_logits.shape)} and "
            f"{tuple(teacher_logits.shape)}"
        )
    log_student = torch.log_softmax(student_logits / temperature, dim=1)
    log_teacher = torch.log_softmax(teacher_logits.detach() / temperature, dim=1)
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum()
    return kl * temperature**2 / student_logits.shape[0]


def rewind_index(forget_errors: Sequence[float], reference_error: float) -> int:
    """SCRUB+R's rewinding: the index of the checkpoint whose forget-set error is closest to ``reference_error``.

    ``reference_error`` is the final model's error on held-out samples like the forgotten ones (the
    authors' "forget-validation" set), so the chosen checkpoint forgets about as much as a model that
    never saw them would err on them; the earliest checkpoint wins a tie.

    Raises:
        ValueError: no checkpoint.
    """
    if not forget_errors:
        raise ValueError("rewinding needs at least one checkpoint")
    return min(range(len(forget_errors)), key=lambda i: abs(forget_errors[i] - reference_error))
