"""Memory-mapped row stores: exclusive creation, no symlinks, a lock, erased rows, checkpoints by reference."""

import os

import pytest
import torch
from helpers_certified import blobs, fit_hf, sgd_model

from lightning_unlearn import ForgetRequest, ReleaseConfig
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.store import RowStore, StoreError
from lightning_unlearn.unlearners import HFUnlearner

CAPACITY = 512


def mmap_recorder(path, **kw) -> TrajectoryRecorder:
    return TrajectoryRecorder(dtype=torch.float64, store="mmap", path=path, capacity=CAPACITY, **kw)


def test_store_is_created_new_never_over_a_file_or_through_a_symlink(tmp_path):
    existing = tmp_path / "existing.bin"
    existing.write_bytes(b"user data")
    with pytest.raises(StoreError, match="already exists"):
        RowStore.create(existing, 4, 3, torch.float32)
    assert existing.read_bytes() == b"user data"

    target = tmp_path / "target.bin"
    target.write_bytes(b"secret")
    (tmp_path / "link.bin").symlink_to(target)
    (tmp_path / "dangling.bin").symlink_to(tmp_path / "nowhere.bin")
    for link in ("link.bin", "dangling.bin"):
        with pytest.raises(StoreError, match="symlink"):
            RowStore.create(tmp_path / link, 4, 3, torch.float32)
    assert target.read_bytes() == b"secret" and not (tmp_path / "nowhere.bin").exists()

    store = RowStore.create(tmp_path / "new.bin", 4, 3, torch.float32)
    assert os.stat(tmp_path / "new.bin").st_mode & 0o777 == 0o600  # statistics are private
    assert torch.equal(store.data, torch.zeros(4, 3))
    with pytest.raises(StoreError, match="holds 4 rows"):
        store.reserve(5)


def test_erased_rows_are_zero_in_the_file(tmp_path):
    store = RowStore.create(tmp_path / "s.bin", 4, 3, torch.float64)
    store.data[:] = torch.arange(1.0, 13.0, dtype=torch.float64).view(4, 3)
    store.erase(torch.tensor([1, 3]))
    on_disk = torch.frombuffer(bytearray((tmp_path / "s.bin").read_bytes()), dtype=torch.float64).view(4, 3)
    assert torch.equal(on_disk[[1, 3]], torch.zeros(2, 3)) and torch.equal(on_disk[[0, 2]], store.data[[0, 2]])


def test_checkpoint_references_the_store_and_two_recorders_cannot_share_it(tmp_path):
    ds, path = blobs(48, seed=1), tmp_path / "hf.bin"
    model, rec = sgd_model(), mmap_recorder(path)
    fit_hf(model, ds, rec, epochs=2)
    state = rec.state_dict()
    assert isinstance(state["A"], dict) and state["A"]["rows"] == 48  # a reference and a digest, no rows
    tensor_bytes = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    assert tensor_bytes < 48 * rec.A.shape[1] * 8
    rows = rec.A[:48].clone()

    with pytest.raises(StoreError, match="in use by another store"):  # the fitted recorder still holds the lock
        mmap_recorder(path).load_state_dict(state)
    with pytest.raises(StoreError, match="already exists"):  # a fresh fit never overwrites the store
        fit_hf(sgd_model(), ds, mmap_recorder(path), epochs=1)
    assert torch.equal(rec.A[:48], rows)

    rec.close()
    restored = mmap_recorder(path)
    restored.load_state_dict(state)  # reattached to the file, rows checked against the digest
    assert torch.equal(restored.A[:48], rows)
    with pytest.raises(StoreError, match="in use by another store"):
        mmap_recorder(path).load_state_dict(state)

    HFUnlearner(model, restored, release=ReleaseConfig(noise=False)).forget(ForgetRequest.samples([3, 7]))
    r3, r7 = restored.row_of[3], restored.row_of[7]
    on_disk = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float64).view(CAPACITY, -1)
    assert torch.equal(on_disk[[r3, r7]], torch.zeros(2, rows.shape[1])) and on_disk[:48].abs().sum() > 0
    restored.close()
    with pytest.raises(StoreError, match="digest mismatch"):  # the old checkpoint predates the deletion
        mmap_recorder(path).load_state_dict(state)


def test_reference_restores_into_another_store_or_memory_and_checks_the_file(tmp_path):
    ds, path = blobs(32, seed=2), tmp_path / "hf.bin"
    rec = mmap_recorder(path)
    fit_hf(sgd_model(), ds, rec, epochs=1)
    state, rows = rec.state_dict(), rec.A[:32].clone()
    rec.close()

    copy = mmap_recorder(tmp_path / "copy.bin")
    copy.load_state_dict(state)  # a new file of its own, filled from the referenced one
    in_memory = TrajectoryRecorder(dtype=torch.float64)
    in_memory.load_state_dict(state)
    assert torch.equal(copy.A[:32], rows) and torch.equal(in_memory.A[:32], rows)
    assert copy._rows.path == tmp_path / "copy.bin"
    copy.close()

    moved = tmp_path / "moved.bin"
    path.rename(moved)
    with pytest.raises(StoreError, match="missing"):
        TrajectoryRecorder(dtype=torch.float64).load_state_dict(state)
    path.symlink_to(moved)
    refused = TrajectoryRecorder(dtype=torch.float64)
    with pytest.raises(StoreError, match="symlink"):
        refused.load_state_dict(state)
    assert len(refused.catalog) == 0 and refused.A is None  # a refused state leaves the recorder untouched
