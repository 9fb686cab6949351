"""`ReleaseRefused`: a certified release a method refuses, because an assumption of its guarantee fails."""

from __future__ import annotations


class ReleaseRefused(ValueError):
    """A certified release refused: an assumption of the method's guarantee fails (the step size, the solver's
    residual, the strong convexity, the Hessian's Lipschitz constant, ...), or the release would exceed the privacy
    budget. The message names the method and every failing assumption, measured; nothing was changed (the
    refusal comes before the commit), so the request can be retried with another recipe, or without a certificate
    (``noise=False``, ``sigma_override``), which then says it is not certified.

    A ``ValueError``, as every refusal of input the library cannot honour; its own type lets a long job (e.g.
    ``lightning-unlearn reproduce``) record the refusal and go on, while any other error stops it.
    """
