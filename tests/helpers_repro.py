"""A tiny reproduction config as a user writes one (YAML), for the tests of ``reproduce`` as a long job."""

from __future__ import annotations

from pathlib import Path

HEAD = """\
name: tiny
paper: '[HF]'
table: Table 2
protocol: HF on 40 digits, learned at once; two requests of one sample each
columns: [TA, Distance]
aggregate: last
smoke_setups: 1
setups:
- label: LR
  protocol: single
  source: a test
  methods:
"""
SCALE = """\
  {scale}:
    dataset: {dataset}
    model: linear
    epochs: {epochs}
    lr: 0.5
    batch_size: 16
{per_class}    requests:
    - {{label: K=2, k: 2, per_request: 1, compare: last}}
"""


def tiny_config(path: Path, methods: list[str], epochs: int = 1) -> Path:
    """Write the config to ``path``: ``methods`` are its method lines (YAML flow mappings); its smoke scale learns 4
    digits per class for ``epochs`` epochs at lr 0.5, which breaks [HF]'s step-size condition ``lr <= 2/(M + l2)``
    (0.18 on these digits at l2 = 0.5: a certified HF release with ``lr_margin: null`` is refused)."""
    text = HEAD + "".join(f"  - {m}\n" for m in methods)
    text += SCALE.format(scale="full", dataset="split-mnist", epochs=epochs, per_class="")
    text += SCALE.format(scale="smoke", dataset="digits", epochs=epochs, per_class="    per_class: 4\n")
    text += "  paper:\n    K=2:\n      HF certified: {TA: 87.5}\n"
    path.write_text(text)
    return path
