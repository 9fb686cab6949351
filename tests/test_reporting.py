"""Executed requests reach the Trainer's loggers: flushed, on one increasing step axis (one Trainer fits every
experience), without undoing a request."""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
from helpers_certified import blobs, sgd_model, trainer
from lightning.pytorch.loggers import CSVLogger, Logger
from torch.utils.data import DataLoader

from lightning_unlearn import ForgetRequest, HFUnlearner, ReleaseConfig, TrajectoryRecorder
from lightning_unlearn.metrics import log_metrics
from lightning_unlearn.reporting import result_metrics
from lightning_unlearn.warnings import UnlearningWarning

BATCH = 8


def fit(t: L.Trainer, model, recorder, ds, experience: int) -> L.Trainer:
    """One more experience with the same Trainer, as a user's own continual loop does (Lightning's own counters
    then continue: one epoch more than the Trainer has run)."""
    recorder.experience = experience
    t.fit_loop.max_epochs = t.current_epoch + 1
    t.fit(model, DataLoader(ds, batch_size=BATCH))
    return t


def test_a_users_own_loop_logs_requests_between_experiences_on_one_step_axis(tmp_path):
    tasks = [blobs(16, seed=0), blobs(16, seed=1, id_offset=100)]
    model, rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64)
    strategy = HFUnlearner(model, rec, max_deletions=10, release=ReleaseConfig(epsilon=1.0, seed=0))
    t = trainer([rec], logger=CSVLogger(tmp_path, name="run"), log_every_n_steps=1)
    fit(t, model, rec, tasks[0], 0)
    first = strategy.forget(ForgetRequest.samples([3, 5]))
    fit(t, model, rec, tasks[1], 1)
    strategy.forget(ForgetRequest.samples([101]))
    log_metrics(t, {"retain_acc": 0.5})  # a user's evaluation: after the request, flushed

    with open(t.log_dir + "/metrics.csv") as f:  # on disk: each request's row was flushed
        rows = list(csv.DictReader(f))
    train = [int(r["step"]) for r in rows if r.get("train_loss")]
    requests = [(int(r["step"]), float(r["unlearn/removed"])) for r in rows if r.get("unlearn/removed")]
    assert train == [0, 1, 2, 3]  # the second fit continues the first one's steps
    assert requests == [(2, 2.0), (4, 1.0)]  # each at the step where training resumes
    assert [(int(r["step"]), r["unlearn/retain_acc"]) for r in rows if r.get("unlearn/retain_acc")] == [(4, "0.5")]
    assert [int(r["step"]) for r in rows] == sorted(int(r["step"]) for r in rows)
    logged = next(r for r in rows if r.get("unlearn/removed") == "2.0")
    assert float(logged["unlearn/epsilon"]) == 1.0 and float(logged["unlearn/sigma"]) == first.certificate.sigma


def test_result_metrics_carry_the_certificate_summary_and_scalar_extras():
    model, rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64)
    trainer([rec]).fit(model, DataLoader(blobs(16, seed=0), batch_size=BATCH))
    result = HFUnlearner(model, rec, max_deletions=10, release=ReleaseConfig(noise=False)).forget(
        ForgetRequest.samples([1])
    )
    result.extra["vector"] = torch.ones(3)  # not a scalar: left out
    metrics = result_metrics(result)
    assert metrics["unlearn/removed"] == 1.0 and metrics["unlearn/exact"] == 0.0
    assert metrics["unlearn/certified"] == 0.0 and "unlearn/epsilon" not in metrics  # noise=False: uncertified
    bounds = {k for k in metrics if k.startswith("unlearn/bound/")}
    assert bounds and all(isinstance(v, float) for v in metrics.values())
    assert "unlearn/extra/vector" not in metrics


class BrokenLogger(Logger):
    name, version = "broken", 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        return None

    def log_metrics(self, metrics, step=None) -> None:
        if any(k.startswith("unlearn/") for k in metrics):
            raise OSError("disk full")


def test_a_failing_logger_warns_and_leaves_the_request_committed():
    model, rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64)
    trainer([rec], logger=BrokenLogger()).fit(model, DataLoader(blobs(16, seed=0), batch_size=BATCH))
    strategy = HFUnlearner(model, rec, max_deletions=10, release=ReleaseConfig(noise=False))
    with pytest.warns(UnlearningWarning, match="logging it failed.*disk full"):
        strategy.forget(ForgetRequest.samples([2]))
    assert rec.catalog.forgotten[rec.catalog.rows(torch.tensor([2]))].item()
    assert len(strategy.ledger) == 1
