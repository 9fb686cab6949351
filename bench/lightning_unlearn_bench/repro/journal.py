"""A run's finished rows on disk, one JSON file each as soon as it is measured, so that a stopped run keeps them and
``--resume`` skips them.

A row is one method of one setup's request set (:class:`Unit`): its harness rows, its reference's, the schedule it
ran and the exact recipe that made it; or, when the method refused a certified release
(:class:`~lightning_unlearn.core.refusal.ReleaseRefused`), the refusal's message and no harness rows of its own: a
finished row all the same, which ``--resume`` skips like any other. Its key is ``(setup, request set, paper row)``;
its ``digest`` hashes the recipe (the scale without its other request sets, the request set, the method entry and
its scale options, the seed, the Trainer arguments and the LiRA shadow count), so a row whose recipe changed is run
again, never reused. Files live in ``<out>/<setup>/rows/<request set>--<paper row>.json`` and are replaced atomically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_unlearn_bench.repro.schema import Entry, Requests, Scale, Setup

#: a row's key: (setup label, request set label, paper row)
Key = tuple[str, str, str]


def slug(text: str) -> str:
    """``text`` as a file name: letters, digits and ``-_.`` kept, anything else ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text).strip("_")


def recipe(
    scale: Scale, requests: Requests, entry: Entry, seed: int, trainer_kwargs: Mapping[str, Any], shadows: int
) -> dict[str, Any]:
    """Everything that decides a row's numbers, as plain data (what :func:`digest` hashes)."""
    return {
        "scale": {
            f.name: getattr(scale, f.name)
            for f in dataclasses.fields(scale)
            if f.name not in ("requests", "options", "only")
        },
        "requests": dataclasses.asdict(requests),
        "entry": dataclasses.asdict(entry),
        "scale_options": dict(scale.options.get(entry.name, {})),
        "seed": seed,
        "trainer": dict(trainer_kwargs),
        "shadows": shadows,
    }


def digest(data: Mapping[str, Any]) -> str:
    """A short hash of ``data`` (its canonical JSON)."""
    text = json.dumps(data, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Unit:
    """One finished row: a method of a setup's request set, its harness rows and its reference's (``refused``: the
    message of the certified release the method refused; then ``rows`` and ``end_rows`` are empty)."""

    setup: str
    requests: str
    paper_row: str
    method: str
    digest: str
    recipe: dict[str, Any]
    schedule: dict[str, Any]
    rows: list[dict[str, Any]]
    end_rows: list[dict[str, Any]]
    reference_rows: list[dict[str, Any]]
    end_reference_rows: list[dict[str, Any]]
    seconds: float
    refused: str | None = None

    @property
    def key(self) -> Key:
        return (self.setup, self.requests, self.paper_row)


def unit_path(out: Path, key: Key) -> Path:
    setup, requests, row = key
    return out / slug(setup) / "rows" / f"{slug(requests)}--{slug(row)}.json"


def save(out: Path, unit: Unit) -> Path:
    """Write ``unit`` to its file (a temporary file renamed over it: a killed run leaves the old file or the new)."""
    path = unit_path(out, unit.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(unit), default=_number))
    os.replace(tmp, path)
    return path


def load(out: Path, key: Key) -> Unit | None:
    """The finished row ``key`` of the run in ``out`` (``None``: not there, or unreadable: then it runs again)."""
    path = unit_path(out, key)
    try:
        return Unit(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _number(value: Any) -> Any:
    """Tensors and numpy scalars in a row as plain numbers."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"cannot write {type(value).__name__} to a row file")


def setup_keys(setup: Setup, scale: Scale) -> list[tuple[Requests, Entry]]:
    """The rows of a setup at a scale, in the order they run: each request set, then each method of the setup
    (those of ``scale.only`` when it names some)."""
    entries = [e for e in setup.methods if scale.only is None or e.paper_row in scale.only]
    return [(requests, entry) for requests in scale.requests for entry in entries]
