"""Append-only ledger of executed forget requests (JSON lines, hash-chained for audit)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.request import ForgetRequest

if TYPE_CHECKING:
    from lightning_unlearn.strategies.base import UnlearningResult, UnlearningStrategy

_GENESIS = "0" * 64


def weights_digest(module: nn.Module) -> str:
    """SHA-256 of a module's state_dict (names, dtypes and bytes), to pin what a request left behind."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass(frozen=True)
class LedgerEntry:
    """One executed request: what, when, by which method, with which guarantee."""

    seq: int
    timestamp: str
    method: str
    request: dict[str, Any]
    removed_ids: list[int]
    wall_time_s: float
    certificate: dict[str, Any]
    weights_sha256: str
    extra: dict[str, Any] = field(default_factory=dict)
    prev_hash: str = _GENESIS
    hash: str = ""

    def _body(self) -> str:
        d = asdict(self)
        d.pop("hash")
        return json.dumps(d, sort_keys=True)

    def computed_hash(self) -> str:
        return hashlib.sha256(self._body().encode()).hexdigest()

    @property
    def forget_request(self) -> ForgetRequest:
        return ForgetRequest.from_dict(self.request)

    @property
    def cert(self) -> Certificate:
        return Certificate.from_dict(self.certificate)


class Ledger:
    """Append-only record of executed forget requests.

    With a ``path``, each entry is appended as one JSON line and flushed before ``append``
    returns; an existing file is read and its hash chain verified, and new entries continue it.
    Without a path the ledger lives in memory. Entries are never rewritten: each carries the
    hash of its predecessor, so :meth:`verify` detects edits, deletions and reordering.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._entries: list[LedgerEntry] = []
        if self.path is not None and self.path.exists():
            with self.path.open() as fh:
                self._entries = [LedgerEntry(**json.loads(line)) for line in fh if line.strip()]
            self.verify()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(tuple(self._entries))

    def __getitem__(self, i: int) -> LedgerEntry:
        return self._entries[i]

    def forgotten_ids(self) -> set[int]:
        return {i for e in self._entries for i in e.removed_ids}

    def append(self, result: UnlearningResult, module: nn.Module) -> LedgerEntry:
        """Record an executed request (called by :meth:`UnlearningStrategy.forget`)."""
        body = LedgerEntry(
            seq=len(self._entries),
            timestamp=datetime.now(timezone.utc).isoformat(),
            method=result.certificate.method,
            request=result.request.to_dict(),
            removed_ids=result.removed_ids.tolist(),
            wall_time_s=result.wall_time_s,
            certificate=result.certificate.to_dict(),
            weights_sha256=weights_digest(module),
            extra={k: v for k, v in result.extra.items() if isinstance(v, (int, float, str, bool))},
            prev_hash=self._entries[-1].hash if self._entries else _GENESIS,
        )
        entry = LedgerEntry(**{**asdict(body), "hash": body.computed_hash()})
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(json.dumps(asdict(entry), sort_keys=True) + "\n")
                fh.flush()
        self._entries.append(entry)
        return entry

    def verify(self) -> None:
        """Raise ``ValueError`` if any entry was edited, dropped or reordered."""
        prev = _GENESIS
        for k, e in enumerate(self._entries):
            if e.seq != k or e.prev_hash != prev or e.hash != e.computed_hash():
                raise ValueError(f"ledger {self.path or '(memory)'} is corrupt at entry {k}")
            prev = e.hash

    def replay(self, strategy: UnlearningStrategy, data: Any = None) -> list[tuple[LedgerEntry, bool]]:
        """Re-execute every recorded request on ``strategy`` (restored to the pre-request state).

        Returns each entry with whether the replayed weights hash equals the recorded one.
        For exact methods every flag must be True; noisy certified methods draw fresh noise
        (the noise seed is deliberately never stored), so only their removed ids are compared.
        """
        self.verify()
        out = []
        for e in self._entries:
            result = strategy.forget(e.forget_request, data)
            if result.removed_ids.tolist() != e.removed_ids:
                raise ValueError(f"replay of entry {e.seq} removed different samples than recorded")
            out.append((e, weights_digest(strategy.module) == e.weights_sha256))
        return out
