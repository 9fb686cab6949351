"""Append-only ledger of executed forget requests: JSON lines in a hash chain an auditor can check.

Each entry carries the hash of its predecessor and its own hash: SHA-256 of its body, or
HMAC-SHA256 when a key is set in the environment variable ``LIGHTNING_UNLEARN_LEDGER_KEY`` (the key
is never written anywhere). Whether the key is set, not anything read from the file, decides
which hash is checked: with the key every entry must be an HMAC (an entry relabelled as unkeyed
and rehashed with plain SHA-256 is a downgrade, refused); without it a keyed entry cannot be
checked and says so. The chain detects an edited, reordered or deleted entry; what it cannot
detect alone (the last entries cut off, the file emptied, deleted or replaced by another valid
chain, or, without a key, a rewritten chain) is detected by :meth:`Ledger.verify` against an
*anchor*, the entry count and head hash that every recorder's ``state_dict`` (so every
checkpoint) carries after a request.

Durability follows the write-ahead logs of databases: an entry is one ``os.write`` loop of its
line and ``os.fsync`` of the file (and of its directory when the file is created) under an
exclusive lock (``filelock``), before the request counts as done. A failed write (a full disk,
``ENOSPC``/``EFBIG``, an interrupt) is rolled back through the same file descriptor with
``os.ftruncate`` and ``os.fsync``, and the rollback is checked (the file's size is what it was);
were the rollback itself to fail, the next open names the torn last line. A last line without
its newline is an append cut short (never acknowledged): it is refused by number, and
``Ledger(path, recover=True)`` truncates it.

The anchor pins the entries up to it. The entries after it were written since the state it came from was saved:
:meth:`Ledger.verify` lists them in its report (:attr:`LedgerReport.beyond_anchor`), and an unlearner refuses to
run until each is a stopped request of its own run (``redo_pending`` executes it again) or the operator has
confirmed them (``accept_ledger``) or rolled them back (:meth:`Ledger.rollback`). In a ledger opened with
``shared=True`` (written by several runs at once) the entries of other runs are accepted. A chain rehashed
consistently can still repeat an execution: :meth:`Ledger.verify` refuses an entry that forgets samples an earlier
entry of the same run (its ``lineage``) forgot, unless it is that entry's redo (``redo_of``: the same request,
method and ids).

A rollback is itself an entry, never a silent cut: the file is rewritten to the anchored entries' bytes followed by
one ``ledger-rollback`` entry that names the anchor, the operator's reason, and each entry cut (number, hash,
lineage, method, timestamp, request, privacy release; not its removed ids), then ``fsync``-ed and renamed over the
ledger (``os.replace``, then an ``fsync`` of the directory): a crash leaves the old file or the new one.

``weights_digest`` (:mod:`lightning_unlearn.core.digest`) is BLAKE3 over the module's
``state_dict`` after the request.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from filelock import FileLock
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import nn

from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.digest import LEGACY, digest_algorithm, digest_matches, weights_digest
from lightning_unlearn.core.keys import current_key
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.core.result import UnlearningResult
from lightning_unlearn.warnings import warn

__all__ = [
    "EMPTY_ANCHOR",
    "KEY_ENV",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "LedgerReport",
    "ROLLBACK",
    "weights_digest",
]

_GENESIS = "0" * 64
KEY_ENV = "LIGHTNING_UNLEARN_LEDGER_KEY"
#: the anchor of a recorder that has executed no request on a ledger file (every entry is after it)
EMPTY_ANCHOR: Mapping[str, Any] = MappingProxyType({"count": 0, "head": _GENESIS})
#: the ``method`` of the entry that records a rollback (:meth:`Ledger.rollback`)
ROLLBACK = "ledger-rollback"


class LedgerError(ValueError):
    """A ledger that fails its checks: corrupt, torn, truncated, replaced, downgraded, of another method or run, or
    repeating an execution."""


def _ledger_key() -> bytes | None:
    key = os.environ.get(KEY_ENV)
    return key.encode() if key else None


def utc_timestamp() -> str:
    """Now, in UTC, as ISO 8601: the time stamp of a ledger entry and of what is recorded beside it."""
    return datetime.now(timezone.utc).isoformat()


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
        # the fields hold JSON values only (what from_json and Ledger build), so a shallow dict serialises as
        # asdict's deep copy does, without the copy (which was most of a request's time once R entries were re-checked)
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hash"}
        return json.dumps(d, sort_keys=True).encode()

    def computed_hash(self, key: bytes | None) -> str:
        """HMAC-SHA256 of the body with ``key``, or SHA-256 without one (whatever :attr:`keyed` says)."""
        if key is not None:
            return hmac.new(key, self._body(), hashlib.sha256).hexdigest()
        return hashlib.sha256(self._body()).hexdigest()

    @property
    def forget_request(self) -> ForgetRequest:
        return ForgetRequest.from_dict(self.request)

    @property
    def lineage(self) -> str | None:
        """The ``lineage`` of the recorder whose run wrote the entry (``None``: written without one)."""
        recorder = self.extra.get("recorder")
        return recorder if isinstance(recorder, str) else None

    @property
    def method_key(self) -> str:
        """The key of the method that executed the entry, as it is named today (:attr:`method` is the key it was
        written with: a retired one, :data:`~lightning_unlearn.core.keys.RETIRED_KEYS`, reads as its successor)."""
        return current_key(self.method)

    @property
    def is_rollback(self) -> bool:
        """Whether the entry records a rollback (:meth:`Ledger.rollback`) rather than an executed request."""
        return self.method == ROLLBACK

    def summary(self) -> str:
        """Which entry, what, by which run and when, in one line (for reports and errors)."""
        try:
            what = "rollback" if self.is_rollback else f"{self.method} {self.forget_request}"
        except (KeyError, TypeError, ValueError):  # a request no ForgetRequest reads (a forged entry): shown as is
            what = f"{self.method} {self.request!r}"
        return f"entry {self.seq} ({what}, lineage {self.lineage}, {self.timestamp})"

    @property
    def cert(self) -> Certificate:
        return Certificate.from_dict(self.certificate)

    def to_line(self) -> bytes:
        """The entry as it is written: one JSON line, newline included."""
        return (json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, line: str) -> LedgerEntry:
        d = json.loads(line)
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not names >= set(d):
            raise ValueError("not a ledger entry")
        return cls(**d)


@dataclass(frozen=True)
class LedgerReport:
    """What :meth:`Ledger.verify` checked and found intact.

    Args:
        path: the file (``None``: an in-memory ledger).
        count: entries in the chain; ``head``: the last one's hash (the ledger's :meth:`~Ledger.anchor`).
        keyed: the chain was checked with the HMAC key (``LIGHTNING_UNLEARN_LEDGER_KEY``).
        anchor: the checkpoint anchor the ledger was checked against (``None``: the chain alone).
        legacy_digests: entries whose weights digest is XXH3-128 (written before BLAKE3 was used): their
            weights are pinned against accidents, not against a forger who can find collisions.
        beyond_anchor: the entries after the anchor (written since the state it came from was saved), each with
            its number, request, lineage and timestamp (:meth:`LedgerEntry.summary`); empty without an anchor.
    """

    path: str | None
    count: int
    head: str
    keyed: bool
    anchor: dict[str, Any] | None
    legacy_digests: int
    beyond_anchor: tuple[LedgerEntry, ...] = ()

    def __str__(self) -> str:
        where = self.path or "(memory)"
        against = "" if self.anchor is None else f", consistent with the anchor of {int(self.anchor['count'])} entries"
        legacy = f"; {self.legacy_digests} entries with XXH3-128 weights digests" if self.legacy_digests else ""
        kind = "HMAC-SHA256" if self.keyed else "SHA-256"
        beyond = "".join(f"; after the anchor: {e.summary()}" for e in self.beyond_anchor)
        return (
            f"ledger {where}: {self.count} entries, {kind} chain intact, head {self.head[:16]}{against}{legacy}{beyond}"
        )


class Replayable(Protocol):
    """What :meth:`Ledger.replay` needs of an unlearner (the ledger knows no strategy class)."""

    ledger: Ledger

    @property
    def method(self) -> str: ...

    @property
    def reads_data(self) -> bool: ...

    @property
    def module(self) -> nn.Module: ...

    def forget(self, request: ForgetRequest, data: Any = None) -> UnlearningResult: ...


def _fsync_directory(path: Path) -> None:
    """Make a new directory entry durable (POSIX; Windows cannot open a directory, and needs no such step)."""
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _truncate(fd: int, size: int, where: Path) -> None:
    """Cut the file at ``size`` through its descriptor, check it took, and ``fsync`` it.

    The ``fsync`` of the cut is attempted but its failure (a disk failing the failed append's ``fsync`` fails
    this one too) is not raised: the file is the right size now, and were the cut lost in a crash, the next
    open finds either a torn last line (named, ``recover=True``) or a whole entry the state does not hold
    (``redo_pending``), both recoverable.

    Raises:
        LedgerError: the truncation failed, or the file is not ``size`` bytes after it.
    """
    try:
        os.ftruncate(fd, size)
        actual = os.fstat(fd).st_size
    except OSError as err:
        raise LedgerError(
            f"ledger {where}: rolling back a failed append failed ({err}); the file may end in a torn line, which "
            "the next Ledger(path) names (Ledger(path, recover=True) truncates it)"
        ) from err
    if actual != size:
        raise LedgerError(f"ledger {where}: rolled back to {size} bytes but the file has {actual}")
    try:
        os.fsync(fd)
    except OSError:
        pass  # see the docstring: the cut is checked; its durability is what recovery covers


def _write_all(fd: int, data: bytes, path: Path) -> None:
    """``os.write`` until every byte of ``data`` is written, then ``os.fsync`` (``OSError`` on no progress)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, f"write to {path} made no progress")
        view = view[written:]
    os.fsync(fd)


def _append_line(path: Path, line: bytes) -> None:
    """Append ``line`` durably (write loop, fsync; the directory fsynced when the file is new); on any failure
    (``ENOSPC``, ``EFBIG``, an interrupt) truncate back to the former size, fsynced and checked, and re-raise."""
    flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:
        fd = os.open(path, flags)
        created = False
    try:
        size = os.fstat(fd).st_size
        try:
            if created:
                _fsync_directory(path.parent)
            _write_all(fd, line, path)
        except BaseException:
            _truncate(fd, size, path)
            raise
    finally:
        os.close(fd)


def _replace_file(path: Path, content: bytes) -> None:
    """Replace the file at ``path`` (a symlink's target) by ``content`` atomically and durably, its permission bits
    kept: written whole and ``fsync``-ed beside it, renamed over it (``os.replace``), and the directory ``fsync``-ed.
    Before the rename any failure removes the new file and leaves the old one as it was; after it, a failed directory
    ``fsync`` only warns (the rename is done; were it lost in a crash, the old file would be back, and refused again
    against the anchor)."""
    path = Path(os.path.realpath(path))
    new = path.with_name(path.name + ".rollback")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    mode = os.stat(path).st_mode & 0o777
    try:
        fd = os.open(new, flags | getattr(os, "O_NOFOLLOW", 0), mode)
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, mode)  # the mode the umask took from os.open's
            _write_all(fd, content, new)
        finally:
            os.close(fd)
        os.replace(new, path)
    except BaseException:
        new.unlink(missing_ok=True)
        raise
    try:
        _fsync_directory(path.parent)
    except OSError as err:
        warn(f"ledger {path}: rewritten, but the fsync of its directory failed ({err}): a crash may undo the rewrite")


def _offset_after(raw: bytes, count: int) -> int:
    """The byte offset in ``raw`` just after its ``count``-th entry (blank lines are no entries)."""
    offset = seen = 0
    while seen < count:
        end = raw.index(b"\n", offset) + 1
        seen += bool(raw[offset:end].strip())
        offset = end
    return offset


class Ledger:
    """Append-only record of executed forget requests.

    With a ``path``, each entry is appended as one JSON line under an exclusive file lock and
    ``fsync``-ed before :meth:`append` returns (see the module docstring); another ``Ledger`` (or
    process) appending to the same file continues the same chain. Only the global rank 0 writes the
    file (under DDP every rank keeps the same entries in memory). An existing file is read and its
    chain verified; a last line cut by a crash is a :class:`LedgerError` naming its line number,
    unless ``recover=True`` (then that line is truncated away, and a warning names it). Without a
    path the ledger lives in memory: it records nothing durable, and a strategy neither checks it
    against nor writes it into its recorder's anchor.

    Args:
        path: the JSON-lines file (``None``: in memory).
        recover: truncate a torn last line instead of refusing it.
        shared: several runs write this file at once (each its own requests): an unlearner accepts the entries of
            other runs (lineages) written after its recorder's anchor instead of refusing them.

    Raises:
        LedgerError: the file's chain is broken, keyed without the key (or unkeyed with it), or its last
            line is torn (and ``recover`` is off).

    Example::

        >>> import tempfile, torch
        >>> from lightning_unlearn import Certificate, ForgetRequest, Ledger, UnlearningResult
        >>> len(Ledger()), Ledger().verify().count  # in memory
        (0, 0)
        >>> cert = Certificate("retrain", exact=True, statement="retrained on the retained data")
        >>> result = UnlearningResult(ForgetRequest.samples([7, 8]), torch.tensor([7, 8]), cert, wall_time_s=0.1)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     ledger = Ledger(f"{tmp}/ledger.jsonl")
        ...     entry = ledger.append(result, torch.nn.Linear(2, 1))  # the module after the request
        ...     report = Ledger(f"{tmp}/ledger.jsonl").verify(ledger.anchor())  # reopened, checked
        >>> len(ledger), entry.seq, entry.method, entry.removed_ids
        (1, 0, 'retrain', [7, 8])
        >>> report.count, report.head == entry.hash, report.beyond_anchor
        (1, True, ())
    """

    def __init__(self, path: str | Path | None = None, recover: bool = False, shared: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.shared = shared
        self._entries: list[LedgerEntry] = []
        # the executions checked by verify (_check_executions): the first _indexed entries, by (lineage, sample id)
        self._indexed = 0
        self._executed: dict[tuple[str, int], int] = {}
        # what was checked: the file's bytes as last read or written (the writing rank), and the number of leading
        # entries whose chain was checked under _checked_key; a later check reads the file again but parses and
        # hashes only what follows those bytes, so a request's cost does not grow with the ledger
        self._raw = b""
        self._checked, self._checked_key = 0, _ledger_key()
        if self.path is not None and self.path.exists():
            with self._locked():
                self._raw, self._entries = self._read(recover)
            self._check_chain(self._entries)

    # -- reading ---------------------------------------------------------------------------------
    def _read(self, recover: bool = False) -> tuple[bytes, list[LedgerEntry]]:
        """The file's whole lines and their entries (a torn last line refused, or truncated with ``recover``)."""
        assert self.path is not None
        if not self.path.exists():
            return b"", []
        raw = self.path.read_bytes()
        entries, torn = self._parse(raw, 0)
        if torn:
            number = raw.count(b"\n") + 1
            if not recover:
                raise LedgerError(
                    f"ledger {self.path}: torn last line {number} ({len(torn)} bytes without a newline: an append cut "
                    "by a crash; Ledger(path, recover=True) truncates it)"
                )
            fd = os.open(self.path, os.O_RDWR | getattr(os, "O_BINARY", 0))
            try:
                _truncate(fd, len(raw) - len(torn), self.path)
            finally:
                os.close(fd)
            warn(f"ledger {self.path}: truncated a torn last line {number} (an append cut by a crash)")
        return raw[: len(raw) - len(torn)], entries

    def _parse(self, raw: bytes, first_line: int) -> tuple[list[LedgerEntry], bytes]:
        """The entries of ``raw``'s whole lines (numbered from ``first_line + 1`` in errors) and what follows the
        last newline (empty, or an append cut short)."""
        lines = raw.split(b"\n")
        torn = lines.pop()
        entries = []
        for k, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                entries.append(LedgerEntry.from_json(line.decode()))
            except (ValueError, TypeError, UnicodeDecodeError) as err:
                raise LedgerError(f"ledger {self.path}: unreadable line {first_line + k + 1}") from err
        return entries, torn

    def _check_chain(self, entries: list[LedgerEntry], start: int = 0) -> None:
        """``LedgerError`` naming the first entry from ``start`` on whose sequence number, link or hash is wrong;
        the key's presence decides the hash (see the module docstring)."""
        key = _ledger_key()
        where = self.path or "(memory)"
        prev = entries[start - 1].hash if start else _GENESIS
        for k, e in enumerate(entries[start:], start):
            if key is None and e.keyed:
                raise LedgerError(
                    f"ledger {where} entry {k} is keyed (HMAC): set {KEY_ENV} to verify it (without the key the "
                    "chain cannot be checked)"
                )
            if key is not None and not e.keyed:
                raise LedgerError(
                    f"ledger {where} entry {k} is not HMAC-keyed although {KEY_ENV} is set: a downgraded ledger "
                    "(entries relabelled and rehashed without the key), or one written without the key"
                )
            if e.seq != k or e.prev_hash != prev or e.hash != e.computed_hash(key):
                raise LedgerError(f"ledger {where} is corrupt at entry {k}")
            prev = e.hash

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(tuple(self._entries))

    def __getitem__(self, i: int) -> LedgerEntry:
        return self._entries[i]

    def forgotten_ids(self) -> set[int]:
        return {i for e in self._entries for i in e.removed_ids}

    def anchor(self) -> dict[str, Any]:
        """``{"count", "head", "keyed"}``: how many entries, the last hash and whether the chain is HMAC-keyed
        (kept in checkpoints, for :meth:`verify`)."""
        return {
            "count": len(self._entries),
            "head": self._entries[-1].hash if self._entries else _GENESIS,
            "keyed": _ledger_key() is not None,
        }

    # -- writing ---------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            yield

    def _writes(self) -> bool:
        """Whether this process writes the file (it has one, and this is the global rank 0)."""
        # Lightning sets the attribute at import time; its stubs type the decorator as a plain function.
        return self.path is not None and rank_zero_only.rank == 0  # type: ignore[attr-defined]

    def _sync(self) -> None:
        """Re-read the file (under the lock) and adopt its entries, after checking they continue this ledger's.

        Raises:
            LedgerError: the file's chain is broken, or it no longer holds the entries this ledger read or
                wrote (truncated, emptied, deleted, rewritten or replaced since).
        """
        key = _ledger_key()
        assert self.path is not None
        raw = self.path.read_bytes() if self.path.exists() else b""
        if self._raw and key == self._checked_key and raw.startswith(self._raw):
            # the bytes checked before are unchanged: only the entries appended since (by another Ledger) are new
            new, torn = self._parse(raw[len(self._raw) :], self._raw.count(b"\n"))
            if not torn:  # (a torn line: the whole read below names it)
                on_disk = [*self._entries, *new]
                self._check_chain(on_disk, len(self._entries))
                self._raw, self._entries = raw, on_disk
                return
        checked, on_disk = self._read()
        self._check_chain(on_disk)
        ours = [e.hash for e in self._entries]
        if [e.hash for e in on_disk[: len(ours)]] != ours:
            raise LedgerError(
                f"ledger {self.path} no longer holds the {len(ours)} entries this Ledger read or wrote (the file has "
                f"{len(on_disk)}): it was truncated, emptied, deleted, rewritten or replaced since"
            )
        self._raw, self._checked_key, self._entries = checked, key, on_disk

    def append(self, result: UnlearningResult, module: nn.Module, recorder: str | None = None) -> LedgerEntry:
        """Record an executed request (called by :meth:`Unlearner.forget` at its commit point).

        ``recorder`` (the recorder's ``lineage``) is kept in the entry's ``extra``. All or nothing: if the
        write fails, the file is truncated back (checked) and the entry is not kept.
        """
        if not self._writes():
            return self._append(result, module, recorder)
        assert self.path is not None
        with self._locked():
            self._sync()
            entry = self._append(result, module, recorder)
            line = entry.to_line()
            try:
                _append_line(self.path, line)
            except BaseException:
                self._entries.pop()
                raise
            self._raw += line
        return entry

    def _append(self, result: UnlearningResult, module: nn.Module, recorder: str | None) -> LedgerEntry:
        entry = self._sealed(
            len(self._entries),
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
        )
        self._entries.append(entry)
        return entry

    def _sealed(self, seq: int, **body: Any) -> LedgerEntry:
        """The entry ``seq`` with ``body``, timestamped now and chained to entry ``seq - 1`` (hashed with the key)."""
        key = _ledger_key()
        entry = LedgerEntry(
            seq=seq,
            timestamp=utc_timestamp(),
            keyed=key is not None,
            prev_hash=self._entries[seq - 1].hash if seq else _GENESIS,
            **body,
        )
        return replace(entry, hash=entry.computed_hash(key))

    def rollback(
        self, anchor: Mapping[str, Any], reason: str, module: nn.Module, recorder: str | None = None
    ) -> list[LedgerEntry]:
        """Cut the entries after ``anchor`` and record the cut in their place, atomically and durably.

        The file becomes the anchored entries' own bytes and one ``ledger-rollback`` entry (chained and hashed as
        any entry; ``extra`` holds the anchor, ``reason``, ``recorder`` and, for each entry cut, its number, hash,
        lineage, method, timestamp, request and privacy release, never its removed ids; its weights digest is
        ``module``'s), written beside the file, ``fsync``-ed and renamed over it (see the module docstring).
        ``Unlearner.rollback_ledger`` calls it with the recorder's anchor and logs it.

        Returns:
            the entries cut (the record of the cut is now the last entry).

        Raises:
            ValueError: no reason given, the ledger is in memory, or it has no entry after ``anchor``.
            LedgerError: the chain is broken, or the ledger does not hold ``anchor`` (see :meth:`verify`).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("a ledger rollback needs the operator's reason (a non-empty string), which is recorded")
        if self.path is None:
            raise ValueError("an in-memory ledger is never checked against an anchor: nothing to roll back")
        with self._current():
            count = self._check_anchor(anchor)
            cut = self._entries[count:]
            if not cut:
                raise ValueError(f"ledger {self.path} has no entry after the anchor of {count} entries: nothing to cut")
            record = self._sealed(
                count,
                method=ROLLBACK,
                request={},
                removed_ids=[],
                wall_time_s=0.0,
                certificate={},
                weights_digest=weights_digest(module),
                extra={
                    "rolled_back_to": {"count": count, "head": self._entries[count - 1].hash if count else _GENESIS},
                    "reason": reason,
                    "cut": [
                        {
                            "seq": e.seq,
                            "hash": e.hash,
                            "lineage": e.lineage,
                            "method": e.method,
                            "timestamp": e.timestamp,
                            "request": e.request,
                            "release": e.certificate.get("accounting", {}).get("release"),
                        }
                        for e in cut
                    ],
                    **({} if recorder is None else {"recorder": recorder}),
                },
            )
            if self._writes():
                assert self.path is not None
                raw = self._raw[: _offset_after(self._raw, count)] + record.to_line()
                _replace_file(self.path, raw)
                self._raw = raw
            self._entries = [*self._entries[:count], record]
            self._checked = min(self._checked, count)
            self._indexed, self._executed = 0, {}
        return cut

    # -- auditing --------------------------------------------------------------------------------
    @contextmanager
    def _current(self) -> Iterator[None]:
        """Hold the entries as they are now: the file re-read and adopted under its lock (the writing rank, which
        keeps the lock until the block ends), or the entries appended in memory since the last check checked."""
        if self._writes():
            with self._locked():
                self._sync()
                yield
            return
        key = _ledger_key()  # the entries checked before are this ledger's own (it only appends)
        self._check_chain(self._entries, self._checked if key == self._checked_key else 0)
        self._checked, self._checked_key = len(self._entries), key
        yield

    def _check_anchor(self, anchor: Mapping[str, Any]) -> int:
        """The anchor's entry count, after checking the ledger holds it (see :meth:`verify`)."""
        where = self.path or "(memory)"
        count, head = int(anchor["count"]), str(anchor["head"])
        if anchor.get("keyed") and _ledger_key() is None:
            raise LedgerError(
                f"the checkpoint's anchor of ledger {where} was made with an HMAC-keyed chain: set {KEY_ENV}"
            )
        if len(self._entries) < count:
            raise LedgerError(
                f"ledger {where} has {len(self._entries)} entries but the checkpoint anchors {count}: truncated or "
                "replaced (entries dropped, the file emptied or deleted, or another ledger in its place)"
            )
        if count and self._entries[count - 1].hash != head:
            raise LedgerError(
                f"ledger {where} entry {count - 1} differs from the checkpoint's anchor (hash "
                f"{self._entries[count - 1].hash[:16]} here, {head[:16]} anchored): rewritten or replaced "
                "(another run's ledger?)"
            )
        return count

    def _check_executions(self) -> None:
        """``LedgerError`` naming the first entry not checked yet that repeats an execution of its run: it forgets
        sample ids an earlier entry of the same lineage forgot, and is not that entry's redo (``redo_of``, the same
        request, method and ids), or is a rollback record that does not fit its place. Entries without a lineage
        (written without a recorder) are not compared."""
        where = self.path or "(memory)"

        def execution(e: LedgerEntry) -> tuple[Any, ...]:
            return e.lineage, e.method_key, e.request, e.removed_ids

        for e in self._entries[self._indexed :]:
            if e.is_rollback:
                if e.removed_ids or e.extra.get("rolled_back_to") != {"count": e.seq, "head": e.prev_hash}:
                    raise LedgerError(f"ledger {where} entry {e.seq} is a rollback record that does not fit its place")
            elif "redo_of" in e.extra:
                redo = e.extra["redo_of"]
                original = self._entries[redo] if type(redo) is int and 0 <= redo < e.seq else None
                if original is None or execution(original) != execution(e):
                    raise LedgerError(
                        f"ledger {where} entry {e.seq} says it redoes entry {redo}, which is not the same request of "
                        "the same run (lineage, method, request and removed ids)"
                    )
            elif e.lineage is not None:
                again = [i for i in e.removed_ids if (e.lineage, i) in self._executed]
                if again:
                    raise LedgerError(
                        f"ledger {where} entry {e.seq} forgets sample ids {again[:10]} that entry "
                        f"{self._executed[e.lineage, again[0]]} of the same run (lineage {e.lineage}) already forgot: "
                        "a repeated execution (an entry appended again, its chain rehashed?); "
                        "Unlearner.rollback_ledger cuts the entries after a recorder's anchor"
                    )
                self._executed.update(((e.lineage, i), e.seq) for i in e.removed_ids)
            self._indexed += 1

    def verify(self, anchor: Mapping[str, Any] | None = None) -> LedgerReport:
        """Check the chain and that no entry repeats an execution, and against ``anchor`` (a recorder's
        ``ledger_anchor`` from a checkpoint; :data:`EMPTY_ANCHOR` for one that executed nothing on this file).

        A ledger with a file re-reads it first (on the writing rank): what is checked is the file as it is
        now, and it must still hold every entry this ``Ledger`` read or wrote. The entries after the anchor are
        not refused here: the report lists them (an unlearner refuses them, see the module docstring).

        Returns:
            a :class:`LedgerReport`: the verified count and head, whether the chain was keyed, the anchor, the
            entries after it.

        Raises:
            LedgerError: an entry was edited, dropped or reordered; keyed entries without the key, or unkeyed
                ones with it; the file lost entries this ledger holds; the ledger has fewer entries than
                the anchor (truncated, emptied, deleted or replaced) or another entry at the anchor's
                position (rewritten, or another run's ledger); the anchor was made with the HMAC key and it
                is not set; an entry forgets samples an earlier entry of its run forgot (not as its redo).
        """
        with self._current():
            count = None if anchor is None else self._check_anchor(anchor)
            self._check_executions()
            entries = tuple(self._entries)
        return LedgerReport(
            path=None if self.path is None else str(self.path),
            count=len(entries),
            head=entries[-1].hash if entries else _GENESIS,
            keyed=_ledger_key() is not None,
            anchor=None if anchor is None else dict(anchor),
            legacy_digests=sum(digest_algorithm(e.weights_digest) == LEGACY for e in entries),
            beyond_anchor=() if count is None else entries[count:],
        )

    def replay(self, strategy: Replayable, data: Any = None) -> list[tuple[LedgerEntry, bool]]:
        """Re-execute every recorded request on ``strategy`` (restored to the pre-request state).

        The replay writes to a fresh in-memory ledger, never to this one. Returns each entry with
        whether the replayed weights' digest equals the recorded one (computed with the entry's own
        algorithm): for exact methods every flag must be True; noisy certified methods draw fresh noise
        (never stored) unless seeded, so only their removed ids are compared.

        Raises:
            LedgerError: the chain is broken, or an entry was executed by another method than
                ``strategy``'s, or the replay removed other samples than recorded.
        """
        self.verify()
        own, strategy.ledger = strategy.ledger, Ledger()
        try:
            out = []
            for e in self._entries:
                if e.is_rollback:  # a record of entries cut, which executed nothing
                    continue
                if e.method_key != strategy.method:
                    raise LedgerError(f"ledger entry {e.seq} was executed by {e.method!r}, not by {strategy.method!r}")
                result = strategy.forget(e.forget_request, data if strategy.reads_data else None)
                if result.removed_ids.tolist() != e.removed_ids:
                    raise LedgerError(f"replay of entry {e.seq} removed different samples than recorded")
                out.append((e, digest_matches(strategy.module, e.weights_digest)))
            return out
        finally:
            strategy.ledger = own
