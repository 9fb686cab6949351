"""Import Avalanche without the warnings of its import that no user of this package can act on.

Avalanche's training package imports ``qpsolvers`` for its GEM and A-GEM plugins. ``qpsolvers`` warns "no QP solver
found" when it is imported without one installed (this package uses no QP solver; a user who runs GEM without one gets
``qpsolvers``' own error at its first solve), and with its open-source solvers installed (Avalanche asks for them; the
lock file has them) it imports ``jaxopt``, which warns on import that it is no longer maintained. Those two warnings
alone, from those modules alone, are dropped here, where Avalanche is first imported; everything else Avalanche warns
stays visible.
"""

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning, module="qpsolvers")
    warnings.filterwarnings("ignore", message="JAXopt is no longer maintained", category=DeprecationWarning)
    import avalanche.training  # noqa: F401
