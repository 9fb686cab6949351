"""Import Avalanche without the one warning of its import that no user of this package can act on.

Avalanche's training package imports ``qpsolvers`` for its GEM and A-GEM plugins, and ``qpsolvers`` warns
"no QP solver found" when it is imported without one installed. This package uses no QP solver; a user who
runs GEM without one gets ``qpsolvers``' own error at its first solve. That warning alone, from that module
alone, is dropped here, where Avalanche is first imported; everything else Avalanche warns stays visible.
"""

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning, module="qpsolvers")
    import avalanche.training  # noqa: F401
