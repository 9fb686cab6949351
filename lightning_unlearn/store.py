"""`RowStore`: rows of per-sample statistic vectors, in memory or in a memory-mapped file.

A memory-mapped store is a file this library creates and owns:

* it is created exclusively (``O_CREAT | O_EXCL``, mode ``0600``): an existing file or a symlink
  at the path is refused, never overwritten or followed;
* it is locked (``filelock``, exclusive, non-blocking, on the lock file ``<path>.lock`` beside it) for as
  long as the store is open, so a second store on the same file, in this process or another, is
  refused instead of writing into the first one's rows;
* an erased row is overwritten with zeros and flushed to the file (``msync``), so a deleted
  statistic does not survive in the store;
* a checkpoint holds a reference to the file (its path and shape) and a BLAKE3 digest of the rows
  in use (``blake3:<hex>``; checkpoints of earlier versions hold a bare XXH3-128 digest, still
  checked as such), never the rows: :meth:`RowStore.attach` reopens the file and refuses it if the
  digest differs (the file changed after the checkpoint was saved, or was replaced).
"""

from __future__ import annotations

import mmap
import os
import weakref
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import torch
import xxhash
from filelock import FileLock, Timeout
from torch import Tensor

_DTYPES = {str(d): d for d in (torch.float16, torch.float32, torch.float64)}
# POSIX flags (Windows has neither: there the symlink check before opening is the guard)
_NOFOLLOW, _CLOEXEC = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_CLOEXEC", 0)


class StoreError(ValueError):
    """A memory-mapped store that cannot be created, opened or trusted (exists, symlink, locked, changed)."""


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise StoreError(f"store dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def _unlock(fd: int, lock: FileLock) -> None:
    try:
        os.close(fd)
    finally:
        lock.release()


class RowStore:
    """A ``(rows, dim)`` tensor of per-sample vectors; row ``k`` belongs to one sample.

    Use :meth:`memory`, :meth:`create` (a new memory-mapped file) or :meth:`attach` (the file a
    checkpoint references). :attr:`data` is the tensor; write rows through it, erase them with
    :meth:`erase`.
    """

    def __init__(
        self,
        data: Tensor,
        path: Path | None = None,
        fd: int | None = None,
        buffer: mmap.mmap | None = None,
        lock: FileLock | None = None,
    ) -> None:
        self.data = data
        self.path = path
        self._fd = fd
        self._mmap = buffer
        self._release = weakref.finalize(self, _unlock, fd, lock) if fd is not None and lock is not None else None

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def memory(cls, dim: int, dtype: torch.dtype, rows: int = 64, device: torch.device | str | None = None) -> RowStore:
        """An in-memory store of ``rows`` zero rows on ``device`` (it grows on :meth:`reserve`)."""
        return cls(torch.zeros(rows, dim, dtype=dtype, device=device))

    @classmethod
    def create(cls, path: str | Path, capacity: int, dim: int, dtype: torch.dtype) -> RowStore:
        """A new memory-mapped store of ``capacity`` zero rows in a file created at ``path``.

        Raises:
            StoreError: ``path`` exists (the store never overwrites a file) or is a symlink.
        """
        path = Path(path).absolute()
        if path.is_symlink():
            raise StoreError(f"store path {path} is a symlink; a memory-mapped store refuses to follow symlinks")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise StoreError(
                f"store file {path} already exists; a memory-mapped store is always created new (never overwritten): "
                "remove the file or choose another path, or restore the recorder from the checkpoint that references it"
            ) from None
        try:
            lock = cls._lock(path)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        try:
            os.ftruncate(fd, capacity * dim * _itemsize(dtype))
        except BaseException:
            _unlock(fd, lock)
            path.unlink(missing_ok=True)
            raise
        return cls._mapped(fd, path, capacity, dim, dtype, lock)

    @classmethod
    def attach(cls, reference: dict[str, Any]) -> RowStore:
        """Reopen the store file a checkpoint references (see :meth:`state_dict`) and check its digest.

        Raises:
            StoreError: the file is missing, a symlink, locked by another store, of another
                size, or its rows differ from the digest recorded in the checkpoint.
        """
        path, dtype = Path(reference["path"]).absolute(), _dtype(reference["dtype"])
        capacity, dim, rows = int(reference["capacity"]), int(reference["dim"]), int(reference["rows"])
        try:
            fd = os.open(path, os.O_RDWR | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            raise StoreError(f"the store file {path} this checkpoint references is missing") from None
        except OSError as err:
            if path.is_symlink():
                raise StoreError(f"store path {path} is a symlink; a memory-mapped store refuses symlinks") from None
            raise StoreError(f"cannot open the store file {path}: {err}") from err
        try:
            lock = cls._lock(path)
        except BaseException:
            os.close(fd)
            raise
        try:
            size, expected = os.fstat(fd).st_size, capacity * dim * _itemsize(dtype)
            if size != expected:
                raise StoreError(
                    f"store file {path} has {size} bytes, the checkpoint references {capacity} x {dim} {dtype} "
                    f"({expected} bytes)"
                )
        except BaseException:
            _unlock(fd, lock)
            raise
        store = cls._mapped(fd, path, capacity, dim, dtype, lock)
        legacy = not str(reference["digest"]).startswith("blake3:")
        if store.digest(rows, legacy=legacy) != reference["digest"]:
            store.close()
            raise StoreError(
                f"store file {path} does not hold the rows this checkpoint recorded (digest mismatch): it changed "
                "after the checkpoint was saved (training or forgetting went on) or was replaced; a checkpoint of a "
                "memory-mapped store is valid only with the file as it was when the checkpoint was saved"
            )
        return store

    @staticmethod
    def _lock(path: Path) -> FileLock:
        """The store's exclusive lock (``<path>.lock``), taken without waiting."""
        lock = FileLock(str(path) + ".lock", timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise StoreError(
                f"store file {path} is in use by another store (locked); two recorders cannot share one store file"
            ) from None
        return lock

    @classmethod
    def _mapped(cls, fd: int, path: Path, capacity: int, dim: int, dtype: torch.dtype, lock: FileLock) -> RowStore:
        try:
            buffer = mmap.mmap(fd, capacity * dim * _itemsize(dtype), access=mmap.ACCESS_WRITE)
        except BaseException:
            _unlock(fd, lock)
            raise
        # numpy holds a buffer export on the map and torch holds the array: the mapping outlives every view
        array = np.frombuffer(buffer, dtype=torch.empty(0, dtype=dtype).numpy().dtype)
        return cls(torch.from_numpy(array).view(capacity, dim), path, fd, buffer, lock)

    # -- use -----------------------------------------------------------------------------------
    @property
    def mapped(self) -> bool:
        return self.path is not None

    @property
    def capacity(self) -> int:
        return int(self.data.shape[0])

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows: an in-memory store grows, a memory-mapped one cannot.

        Raises:
            StoreError: a memory-mapped store's capacity is smaller than ``rows``.
        """
        if rows <= self.capacity:
            return
        if self.mapped:
            raise StoreError(f"memory-mapped store {self.path} holds {self.capacity} rows, {rows} are needed")
        grown = torch.zeros(
            max(rows, 2 * self.capacity), self.data.shape[1], dtype=self.data.dtype, device=self.data.device
        )
        grown[: self.capacity] = self.data
        self.data = grown

    def erase(self, rows: Tensor) -> None:
        """Overwrite ``rows`` with zeros (and write them through to the file of a memory-mapped store)."""
        self.data[rows] = 0
        self.flush()

    def flush(self) -> None:
        if self._mmap is not None:
            self._mmap.flush()

    def digest(self, rows: int, legacy: bool = False) -> str:
        """``blake3:<hex>`` over the dtype, width and bytes of the first ``rows`` rows (BLAKE3's own threads:
        a store can be GiBs); ``legacy``: the bare XXH3-128 hex digest earlier checkpoints hold."""
        head = f"{self.data.dtype}|{self.data.shape[1]}|{rows}|".encode()
        body = self.data[:rows].contiguous().view(torch.uint8).cpu().numpy().data
        if legacy:
            old = xxhash.xxh3_128(head)
            old.update(body)
            return old.hexdigest()
        h = blake3.blake3(head, max_threads=blake3.blake3.AUTO)
        h.update(body)
        return f"blake3:{h.hexdigest()}"

    def close(self) -> None:
        """Flush and unlock a memory-mapped store (another store may then attach to the file)."""
        self.flush()
        if self._release is not None:
            self._release()

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self, rows: int) -> Tensor | dict[str, Any]:
        """A copy of the first ``rows`` rows (in-memory store), or a reference to the file and the
        digest of those rows (memory-mapped store; no row is copied)."""
        if self.path is None:
            return self.data[:rows].clone()
        self.flush()
        return {
            "path": str(self.path),
            "capacity": self.capacity,
            "dim": int(self.data.shape[1]),
            "dtype": str(self.data.dtype),
            "rows": rows,
            "digest": self.digest(rows),
        }


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()
