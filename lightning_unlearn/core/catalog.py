"""`SampleCatalog`: which samples a model has learned, and which it has since forgotten.

The catalog holds only ids, labels, experience indices and a fingerprint of each input (a
64-bit BLAKE2b digest of its bytes, never the input). Recorders fill it during fit; strategies
resolve a :class:`ForgetRequest` against it, and check the data they are given against the
fingerprints, before touching anything. A forgotten sample's fingerprint is erased.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from lightning_unlearn.core.request import ForgetRequest


def _preview(ids: Tensor | list[int], n: int = 10) -> str:
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    return str(ids[:n])[:-1] + (f", ... ({len(ids)} in all)]" if len(ids) > n else "]")


def fingerprints(x: Tensor) -> Tensor:
    """One 64-bit BLAKE2b digest per row of ``x`` (its values and shape); 0 is reserved for "none".

    Floating rows are digested as float64 (exact for every narrower float), so a sample fingerprints the same
    whether a callback saw it as stored or as Lightning's precision plugin cast it (``precision="64-true"`` turns
    a float32 batch into float64 before any hook) and the forget data is read again as stored."""
    rows = x.detach().cpu().contiguous()
    kind = "float" if rows.is_floating_point() else str(rows.dtype)
    head = f"{kind}{tuple(rows.shape[1:])}".encode()
    flat = rows.reshape(rows.shape[0], -1)
    if flat.is_floating_point():
        flat = flat.double()
    data = flat.numpy()
    out = [
        int.from_bytes(hashlib.blake2b(head + r.tobytes(), digest_size=8).digest(), "little", signed=True) or 1
        for r in data
    ]
    return torch.tensor(out, dtype=torch.long)


class SampleCatalog:
    """Ids, labels and experience of every learned sample, plus a forgotten mask.

    Example::

        >>> import torch
        >>> from lightning_unlearn import ForgetRequest, SampleCatalog
        >>> catalog = SampleCatalog()
        >>> catalog.add(torch.tensor([10, 11, 12, 13]), torch.tensor([0, 1, 0, 1]), experience=0)
        >>> ids = catalog.resolve(ForgetRequest.of_class(1))
        >>> catalog.mark_forgotten(ids)
        >>> ids.tolist(), len(catalog), catalog.active_ids().tolist()
        ([11, 13], 4, [10, 12])
        >>> catalog.resolve(ForgetRequest.samples([11]))
        Traceback (most recent call last):
        ...
        ValueError: sample ids already forgotten: [11]
    """

    def __init__(self) -> None:
        self.ids = torch.empty(0, dtype=torch.long)
        self.labels = torch.empty(0, dtype=torch.long)
        self.experiences = torch.empty(0, dtype=torch.long)
        self.forgotten = torch.empty(0, dtype=torch.bool)
        self.fingerprints = torch.empty(0, dtype=torch.long)
        self._row: dict[int, int] = {}

    def __len__(self) -> int:
        return int(self.ids.numel())

    @property
    def n_active(self) -> int:
        return int((~self.forgotten).sum())

    def __contains__(self, sample_id: int) -> bool:
        return int(sample_id) in self._row

    def add(self, ids: Tensor, labels: Tensor, experience: int, prints: Tensor | None = None) -> None:
        """Register newly learned samples. Ids must be new to the catalog and unique.

        ``prints`` are the inputs' :func:`fingerprints` (0: not fingerprinted, never checked).
        """
        ids, labels = ids.detach().long().cpu().flatten(), labels.detach().long().cpu().flatten()
        prints = torch.zeros_like(ids) if prints is None else prints.detach().long().cpu().flatten()
        if ids.shape != labels.shape or ids.shape != prints.shape:
            raise ValueError(f"{ids.numel()} sample ids but {labels.numel()} labels and {prints.numel()} fingerprints")
        if ids.unique().numel() != ids.numel():
            raise ValueError("SampleCatalog.add got duplicate ids in one call")
        known = [i for i in ids.tolist() if i in self._row]
        if known:
            raise ValueError(
                f"sample ids already learned (a sample may be learned once): {_preview(known)}; "
                "give every sample a unique id with IndexedDataset"
            )
        start = len(self)
        self._row.update({i: start + k for k, i in enumerate(ids.tolist())})
        self.ids = torch.cat([self.ids, ids])
        self.labels = torch.cat([self.labels, labels])
        self.experiences = torch.cat([self.experiences, torch.full_like(ids, experience)])
        self.forgotten = torch.cat([self.forgotten, torch.zeros_like(ids, dtype=torch.bool)])
        self.fingerprints = torch.cat([self.fingerprints, prints])

    def rows(self, ids: Tensor) -> Tensor:
        """Row index of each id (ids must be known)."""
        return torch.tensor([self._row[int(i)] for i in ids.tolist()], dtype=torch.long)

    def resolve(self, request: ForgetRequest) -> Tensor:
        """Sample ids a request covers; raises ``ValueError`` naming what is wrong.

        Unknown ids, ids already forgotten, a class or experience never learned, or one whose
        samples are all forgotten already are errors. Nothing is changed here.
        """
        if len(self) == 0:
            raise ValueError("nothing has been learned yet: fit the model with a recorder before forgetting")
        if request.kind == "samples":
            ids = torch.tensor(request.sample_ids, dtype=torch.long)
            unknown = [i for i in request.sample_ids if i not in self._row]
            if unknown:
                raise ValueError(f"unknown sample ids (never learned): {_preview(unknown)}")
            twice = ids[self.forgotten[self.rows(ids)]]
            if twice.numel():
                raise ValueError(f"sample ids already forgotten: {_preview(twice)}")
            return ids
        column = self.labels if request.kind == "class" else self.experiences
        of_target = column.eq(cast(int, request.target))  # ForgetRequest checks class/experience targets are ints
        if not bool(of_target.any()):
            learned = sorted(set(column.tolist()))
            raise ValueError(f"{request.kind} {request.target} was never learned (learned: {learned})")
        active = of_target & ~self.forgotten
        if not bool(active.any()):
            raise ValueError(f"{request.kind} {request.target} has already been forgotten entirely")
        return self.ids[active]

    def check_fingerprints(self, ids: Tensor, x: Tensor) -> None:
        """``ValueError`` naming the ids whose inputs ``x`` are not the ones learned under that id."""
        recorded = self.fingerprints[self.rows(ids)]
        checked = recorded != 0
        if not bool(checked.any()):
            return
        bad = checked & (fingerprints(x) != recorded)
        if bool(bad.any()):
            raise ValueError(
                f"forget data inputs differ from the inputs learned under sample ids {_preview(ids[bad])}: "
                "pass the same samples (same preprocessing, no random augmentation) that were learned"
            )

    def mark_forgotten(self, ids: Tensor) -> None:
        """Mark ``ids`` forgotten and erase their fingerprints (take :meth:`restorer` first for the undo)."""
        rows = self.rows(ids)
        self.forgotten[rows] = True
        self.fingerprints[rows] = 0

    def restorer(self, ids: Tensor) -> Callable[[], None]:
        """The undo of changing the rows of ``ids``: it puts back their forgotten flags and fingerprints as they are
        now. Taken *before* :meth:`mark_forgotten`, so an interrupt between the two leaves nothing to undo wrongly.

        Raises:
            KeyError: an id is not in the catalog (nothing is changed).
        """
        rows = self.rows(ids)
        forgotten, prints = self.forgotten[rows].clone(), self.fingerprints[rows].clone()

        def restore() -> None:
            self.forgotten[rows] = forgotten
            self.fingerprints[rows] = prints

        return restore

    def active_ids(self) -> Tensor:
        return self.ids[~self.forgotten]

    def live(self, ids: list[int]) -> list[int]:
        """Those of ``ids`` that are learned and not forgotten."""
        return [i for i in ids if i in self._row and not bool(self.forgotten[self._row[i]])]

    def labels_of(self, ids: Tensor) -> Tensor:
        return self.labels[self.rows(ids)]

    def experiences_of(self, ids: Tensor) -> Tensor:
        return self.experiences[self.rows(ids)]

    def state_dict(self) -> dict[str, Tensor]:
        return {
            "ids": self.ids.clone(),
            "labels": self.labels.clone(),
            "experiences": self.experiences.clone(),
            "forgotten": self.forgotten.clone(),
            "fingerprints": self.fingerprints.clone(),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore a catalog after checking what :meth:`add` and :meth:`mark_forgotten` guarantee; a refused state
        leaves this catalog as it was.

        Raises:
            ValueError: a column is missing, not one-dimensional or not of an integer (``forgotten``: boolean)
                type; the columns differ in length; an id appears twice (a request could then remove the wrong
                sample under an exact certificate); a forgotten sample still has a fingerprint.
        """
        columns = ("ids", "labels", "experiences", "forgotten")
        missing = [k for k in columns if not isinstance(state.get(k), Tensor)]
        if missing:
            raise ValueError(f"catalog state lacks the columns {missing}")
        prints = state.get("fingerprints")
        loaded = {k: state[k] for k in columns} | {
            "fingerprints": torch.zeros_like(state["ids"]) if prints is None else prints
        }
        for k, t in loaded.items():
            integral = t.dtype == torch.bool if k == "forgotten" else not (t.is_floating_point() or t.is_complex())
            if t.ndim != 1 or not integral or (k != "forgotten" and t.dtype == torch.bool):
                kind = "bool" if k == "forgotten" else "integer"
                raise ValueError(
                    f"catalog column {k!r} must be a 1-d {kind} tensor, got {t.dtype} of shape {tuple(t.shape)}"
                )
        lengths = {t.numel() for t in loaded.values()}
        if len(lengths) != 1:
            raise ValueError(f"catalog state is inconsistent: its columns have different lengths {sorted(lengths)}")
        ids = loaded["ids"].long()
        unique, counts = ids.unique(return_counts=True)
        if unique.numel() != ids.numel():
            raise ValueError(
                f"catalog state names sample ids more than once: {_preview(unique[counts > 1])} (each learned sample "
                "has one row; a repeated id makes a request remove the wrong sample)"
            )
        kept = loaded["forgotten"] & (loaded["fingerprints"] != 0)
        if bool(kept.any()):
            raise ValueError(f"catalog state keeps the fingerprints of forgotten sample ids {_preview(ids[kept])}")
        self.ids = ids.clone()
        self.labels = loaded["labels"].clone().long()
        self.experiences = loaded["experiences"].clone().long()
        self.forgotten = loaded["forgotten"].clone()
        self.fingerprints = loaded["fingerprints"].clone().long()
        self._row = {int(i): k for k, i in enumerate(self.ids.tolist())}
