"""The library's warnings are shown once per cause, and the library's modules and internal fits raise no warning a
user cannot act on."""

import subprocess
import sys
import warnings

import lightning as L
import pytest
import torch
from helpers import N_CLASSES, analytic_model, toy_dataset
from helpers_certified import D_IN, blobs, fit_hf, sgd_model
from helpers_certified import N_CLASSES as BLOB_CLASSES
from torch.utils.data import DataLoader

import lightning_unlearn.warnings
from lightning_unlearn import (
    AnalyticClassifier,
    AnalyticHead,
    AnalyticHeadModule,
    AnalyticRecorder,
    ForgetRequest,
    ReleaseConfig,
    SoftmaxHeadRecorder,
    SupervisedClassifier,
)
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.progress import QUIET_TRAINER, quiet_lightning
from lightning_unlearn.unlearners import HFUnlearner
from lightning_unlearn.warnings import UnlearningWarning, warn


def shown(action: str, body, *args) -> list[str]:
    """The UnlearningWarning texts ``body(*args)`` shows under a filter with ``action`` for them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action, UnlearningWarning)
        body(*args)
    return [str(w.message) for w in caught if w.category is UnlearningWarning]


def test_a_cause_is_shown_once_even_when_filters_change_in_between():
    cause = object()  # a cause no other test uses

    def three_requests():
        for k in range(3):
            warn(f"request {k}: capacity exceeded", cause=cause)
            with warnings.catch_warnings():  # as Lightning and contract.py do around a fit: Python forgets
                warnings.simplefilter("ignore", DeprecationWarning)

    assert shown("default", three_requests) == ["request 0: capacity exceeded"]
    assert shown("default", three_requests) == []  # later in the process: still the same cause


def test_the_same_text_without_a_cause_is_shown_once_and_always_or_error_filters_see_every_occurrence():
    text = f"a text no other test uses {object()!r}"

    def twice():
        for _ in range(2):
            warn(text)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)

    assert shown("default", twice) == [text]
    assert shown("always", twice) == [text, text]  # pytest.warns, -W always: every occurrence
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnlearningWarning)
        with pytest.raises(UnlearningWarning, match="no other test"):
            warn(text)
    assert shown("ignore", twice) == []


def test_hf_capacity_warns_once_over_requests(monkeypatch):
    """Every request beyond max_deletions exceeds the capacity; the warning says so once, not per request."""
    monkeypatch.setattr(lightning_unlearn.warnings, "_warned", set())  # as in a fresh process
    ds = blobs(48, seed=3)
    model, rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64)
    fit_hf(model, ds, rec, epochs=1)
    strategy = HFUnlearner(
        model, rec, max_deletions=1, release=ReleaseConfig(seed=0)
    )  # a capacity this test alone uses

    def requests():
        for i in range(1, 5):
            strategy.forget(ForgetRequest.samples([i]))

    texts = [t for t in shown("default", requests) if "capacity" in t]
    assert len(texts) == 1 and "capacity exceeded: 2 deletions > capacity 1" in texts[0]
    assert "not repeated" in texts[0]


def lightning_warnings(fit) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    return [str(w.message) for w in caught]


UNACTIONABLE = ("module(s) in eval mode", "`val_dataloader`", "LeafSpec")


def test_fitting_the_library_modules_raises_no_lightning_warning_about_them():
    """AnalyticClassifier keeps its frozen backbone in eval mode where it runs, not by its mode flag (Lightning warns
    about modules in eval mode at a fit's start), and neither library module defines an unused validation_step."""
    backbone = analytic_model().backbone.eval()  # a frozen backbone, as users pass it
    model = AnalyticClassifier(backbone, 16, N_CLASSES, expansion_dim=32)
    data = DataLoader(toy_dataset(64), batch_size=32)

    def fit():
        L.Trainer(max_epochs=1, callbacks=[AnalyticRecorder(1.0)], **QUIET_TRAINER).fit(model, data)
        L.Trainer(max_epochs=1, **QUIET_TRAINER).fit(sgd_model(), DataLoader(blobs(32, seed=0), batch_size=16))

    texts = lightning_warnings(fit)
    assert not [t for t in texts if any(u in t for u in UNACTIONABLE[:2])], texts


def test_a_named_frozen_backbone_is_back_in_its_mode_after_each_fit_so_the_next_fit_does_not_warn():
    """The recorders put a named backbone in eval mode for the fit (BatchNorm statistics must not move) and give it
    back its mode at the fit's end: Lightning warns about modules in eval mode when a fit starts, which the user's
    second experience would show for a mode the recorder set."""

    class TrunkAndHead(AnalyticHeadModule):  # a user's module: a BatchNorm trunk, frozen, under a solved head
        def __init__(self) -> None:
            super().__init__()
            self.trunk = torch.nn.Sequential(torch.nn.Linear(D_IN, 8), torch.nn.BatchNorm1d(8)).requires_grad_(False)
            self.head = AnalyticHead(8, BLOB_CLASSES, bias=True)

        def forward(self, x):
            return self.head(self.trunk(x))

    for recorder in (SoftmaxHeadRecorder(0.1, backbone="trunk"), AnalyticRecorder(1.0, backbone="trunk")):
        model, seen = TrunkAndHead(), []

        def fit(model=model, recorder=recorder, seen=seen):
            for k in (0, 1):  # two experiences, a Trainer each
                data = DataLoader(blobs(32, seed=k, id_offset=32 * k), batch_size=16)
                L.Trainer(max_epochs=1, callbacks=[recorder], **QUIET_TRAINER).fit(model, data)
                seen.append(model.trunk.training)

        texts = lightning_warnings(fit)
        assert seen == [True, True]  # the user's mode (a module is built in train mode), not the recorder's eval
        assert not [t for t in texts if "eval mode" in t], texts


def test_quiet_lightning_drops_only_the_internal_fit_warnings():
    class Validating(SupervisedClassifier):
        def validation_step(self, batch, batch_idx):  # the user's own validation, unused by an internal fit
            return None

    model = Validating(torch.nn.Sequential(torch.nn.Linear(D_IN, BLOB_CLASSES)).double(), lr=0.1)
    model.net.eval()
    data = DataLoader(blobs(32, seed=0), batch_size=16)

    def plain():
        L.Trainer(max_epochs=1, **QUIET_TRAINER).fit(model, data)

    def internal():
        with quiet_lightning():
            L.Trainer(max_epochs=1, **QUIET_TRAINER).fit(model, data)
            warnings.warn("kept", UserWarning, stacklevel=1)

    outside = lightning_warnings(plain)
    assert any("`val_dataloader`" in t for t in outside) and any("eval mode" in t for t in outside)  # the control
    inside = lightning_warnings(internal)
    assert "kept" in inside and not [t for t in inside if any(u in t for u in UNACTIONABLE)]


def test_a_warning_names_the_line_that_called_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("where am I")  # the line a user reads under the warning
    assert (caught[0].filename, caught[0].lineno) == (
        __file__,
        test_a_warning_names_the_line_that_called_warn.__code__.co_firstlineno + 3,
    )


def test_the_first_forward_mode_product_of_a_process_shows_no_torch_jit_warning():
    """torch loads forward-mode AD's decompositions with the deprecated ``torch.jit.script`` on its first ``jvp``;
    the library's HVPs load them without that warning (a fresh process: torch does it once per process)."""
    code = (
        "import torch\n"
        "from lightning_unlearn.functional import autodiff\n"
        "loss = autodiff.ModuleLoss(torch.nn.Linear(3, 2), 0.1)\n"
        "x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])\n"
        "H = autodiff.hvps(loss, autodiff.flat_params(loss.module).detach(), x, y, torch.eye(8))\n"
        "assert torch.allclose(H, H.T, atol=1e-5), H\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
