"""Append-only ledger of executed forget requests: JSON lines in a hash chain an auditor can check.

Each entry carries the hash of its predecessor and its own hash (SHA-256 of its body, or
HMAC-SHA256 when a key is set in the environment variable ``LIGHTNING_UNLEARN_LEDGER_KEY``; the
key is never written anywhere). The chain detects an edited, reordered or deleted entry; what it
cannot detect alone (the last entries cut off, the file replaced by a shorter valid one, or, without
a key, a rewritten chain) is detected by :meth:`Ledger.verify` against an *anchor*, the entry count
and head hash that every recorder's ``state_dict`` (so every checkpoint) carries after a request.

``weights_digest`` is XXH3-128 over the names, dtypes, shapes and bytes of the module's
``state_dict`` after the request: it pins which weights were published (fast enough for every
request; it is not collision-resistant against a forger, which the chain and the anchor address).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import xxhash
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import nn

from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.request import ForgetRequest

if TYPE_CHECKING:
    from lightning_unlearn.strategies.base import UnlearningResult, UnlearningStrategy

_GENESIS = "0" * 64
KEY_ENV = "LIGHTNING_UNLEARN_LEDGER_KEY"


class LedgerError(ValueError):
    """A ledger that fails its checks: corrupt, torn, truncated, replaced, or of another method."""


def weights_digest(module: nn.Module) -> str:
    """XXH3-128 of a module's ``state_dict`` (names, dtypes, shapes and bytes of every tensor)."""
    h = xxhash.xxh3_128()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _ledger_key() -> bytes | None:
    key = os.environ.get(KEY_ENV)
    return key.encode() if key else None


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
    weights_digest: str
    extra: dict[str, Any] = field(default_factory=dict)
    keyed: bool = False
    prev_hash: str = _GENESIS
    hash: str = ""

    def _body(self) -> bytes:
        d = asdict(self)
        d.pop("hash")
        return json.dumps(d, sort_keys=True).encode()

    def computed_hash(self, key: bytes | None) -> str:
        if self.keyed:
            if key is None:
                raise LedgerError(f"ledger entry {self.seq} is keyed (HMAC): set {KEY_ENV} to verify it")
            return hmac.new(key, self._body(), hashlib.sha256).hexdigest()
        return hashlib.sha256(self._body()).hexdigest()

    @property
    def forget_request(self) -> ForgetRequest:
        return ForgetRequest.from_dict(self.request)

    @property
    def cert(self) -> Certificate:
        return Certificate.from_dict(self.certificate)

    @classmethod
    def from_json(cls, line: str) -> LedgerEntry:
        d = json.loads(line)
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not names >= set(d):
            raise ValueError("not a ledger entry")
        return cls(**d)


class Ledger:
    """Append-only record of executed forget requests.

    With a ``path``, each entry is appended as one JSON line under an exclusive file lock, flushed
    and ``fsync``-ed before :meth:`append` returns; another ``Ledger`` (or process) appending to
    the same file continues the same chain. Only the global rank 0 writes the file (under DDP every
    rank keeps the same entries in memory). An existing file is read and its chain verified; a last
    line cut by a crash is a :class:`LedgerError` naming its line number, unless ``recover=True``
    (then that line is truncated away, and a warning names it). Without a path the ledger lives in
    memory.

    Raises:
        LedgerError: the file's chain is broken, or its last line is torn (and ``recover`` is off).
    """

    def __init__(self, path: str | Path | None = None, recover: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self._entries: list[LedgerEntry] = []
        if self.path is not None and self.path.exists():
            with self._locked():
                self._entries = self._read(recover)
            self.verify()

    # -- reading ---------------------------------------------------------------------------------
    def _read(self, recover: bool = False) -> list[LedgerEntry]:
        assert self.path is not None
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        entries = []
        for k, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                entries.append(LedgerEntry.from_json(line.decode()))
            except (ValueError, TypeError, UnicodeDecodeError) as err:
                last = k == len(lines) - 1 and not raw.endswith(b"\n")
                if last and recover:
                    keep = len(b"\n".join(lines[:k])) + (1 if k else 0)
                    with self.path.open("r+b") as fh:
                        fh.truncate(keep)
                        os.fsync(fh.fileno())
                    from lightning_unlearn.warnings import warn

                    warn(f"ledger {self.path}: truncated a torn last line {k + 1} (an append cut by a crash)")
                    break
                if last:
                    raise LedgerError(
                        f"ledger {self.path}: torn last line {k + 1} (an append cut by a crash; "
                        "Ledger(path, recover=True) truncates it)"
                    ) from err
                raise LedgerError(f"ledger {self.path}: unreadable line {k + 1}") from err
        return entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(tuple(self._entries))

    def __getitem__(self, i: int) -> LedgerEntry:
        return self._entries[i]

    def forgotten_ids(self) -> set[int]:
        return {i for e in self._entries for i in e.removed_ids}

    def anchor(self) -> dict[str, Any]:
        """``{"count", "head"}``: how many entries and the last hash (kept in checkpoints, for :meth:`verify`)."""
        return {"count": len(self._entries), "head": self._entries[-1].hash if self._entries else _GENESIS}

    # -- writing ---------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def append(self, result: UnlearningResult, module: nn.Module, recorder: str | None = None) -> LedgerEntry:
        """Record an executed request (called by :meth:`UnlearningStrategy.forget` at its commit point).

        ``recorder`` (the recorder's ``lineage``) is kept in the entry's ``extra``. All or nothing: if the
        write fails, the file is truncated back and the entry is not kept.
        """
        path = self.path
        # Lightning sets the attribute at import time; its stubs type the decorator as a plain function.
        if path is None or rank_zero_only.rank != 0:  # type: ignore[attr-defined]
            return self._append(result, module, recorder)
        with self._locked():
            on_disk = self._read()
            if [e.hash for e in on_disk[: len(self._entries)]] != [e.hash for e in self._entries]:
                raise LedgerError(
                    f"ledger {self.path} was changed by another writer in a way that breaks this one's chain"
                )
            self._entries = on_disk
            entry = self._append(result, module, recorder)
            try:
                with path.open("ab") as fh:
                    size = fh.tell()
                    try:
                        fh.write((json.dumps(asdict(entry), sort_keys=True) + "\n").encode())
                        fh.flush()
                        os.fsync(fh.fileno())
                    except BaseException:
                        fh.truncate(size)
                        raise
            except BaseException:
                self._entries.pop()
                raise
        return entry

    def _append(self, result: UnlearningResult, module: nn.Module, recorder: str | None) -> LedgerEntry:
        key = _ledger_key()
        body = LedgerEntry(
            seq=len(self._entries),
            timestamp=datetime.now(timezone.utc).isoformat(),
            method=result.certificate.method,
            request=result.request.to_dict(),
            removed_ids=result.removed_ids.tolist(),
            wall_time_s=result.wall_time_s,
            certificate=result.certificate.to_dict(),
            weights_digest=weights_digest(module),
            extra={
                **{k: v for k, v in result.extra.items() if isinstance(v, (int, float, str, bool))},
                **({} if recorder is None else {"recorder": recorder}),
            },
            keyed=key is not None,
            prev_hash=self._entries[-1].hash if self._entries else _GENESIS,
        )
        entry = LedgerEntry(**{**asdict(body), "hash": body.computed_hash(key)})
        self._entries.append(entry)
        return entry

    # -- auditing --------------------------------------------------------------------------------
    def verify(self, anchor: dict[str, Any] | None = None) -> None:
        """Check the chain, and against ``anchor`` (a recorder's ``ledger_anchor`` from a checkpoint).

        Raises:
            LedgerError: an entry was edited, dropped or reordered; the ledger has fewer entries
                than the anchor (truncated or replaced) or another entry at the anchor's position.
        """
        key = _ledger_key()
        prev = _GENESIS
        where = self.path or "(memory)"
        for k, e in enumerate(self._entries):
            if e.seq != k or e.prev_hash != prev or e.hash != e.computed_hash(key):
                raise LedgerError(f"ledger {where} is corrupt at entry {k}")
            prev = e.hash
        if anchor is None:
            return
        count, head = int(anchor["count"]), anchor["head"]
        if len(self._entries) < count:
            raise LedgerError(
                f"ledger {where} has {len(self._entries)} entries but the checkpoint anchors {count}: truncated or "
                "replaced"
            )
        if count and self._entries[count - 1].hash != head:
            raise LedgerError(
                f"ledger {where} entry {count - 1} differs from the checkpoint's anchor: rewritten or replaced"
            )

    def replay(self, strategy: UnlearningStrategy, data: Any = None) -> list[tuple[LedgerEntry, bool]]:
        """Re-execute every recorded request on ``strategy`` (restored to the pre-request state).

        The replay writes to a fresh in-memory ledger, never to this one. Returns each entry with
        whether the replayed weights' digest equals the recorded one: for exact methods every flag
        must be True; noisy certified methods draw fresh noise (never stored), so only their
        removed ids are compared.

        Raises:
            LedgerError: the chain is broken, or an entry was executed by another method than
                ``strategy``'s, or the replay removed other samples than recorded.
        """
        self.verify()
        own, strategy.ledger = strategy.ledger, Ledger()
        try:
            out = []
            for e in self._entries:
                if e.method != strategy.method:
                    raise LedgerError(f"ledger entry {e.seq} was executed by {e.method!r}, not by {strategy.method!r}")
                result = strategy.forget(e.forget_request, data if strategy.reads_data else None)
                if result.removed_ids.tolist() != e.removed_ids:
                    raise LedgerError(f"replay of entry {e.seq} removed different samples than recorded")
                out.append((e, weights_digest(strategy.module) == e.weights_digest))
            return out
        finally:
            strategy.ledger = own
