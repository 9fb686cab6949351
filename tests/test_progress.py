"""Progress output: internal fits print no Lightning banners, and a request's status line appears when enabled."""

import logging

import lightning as L
import pytest
import torch
from helpers import N_CLASSES, N_FEATURES, quiet_trainer, toy_dataset
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader

from lightning_unlearn import ForgetRequest
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.progress import (
    ENV,
    StageLines,
    output_mode,
    progress_bar,
    progress_enabled,
    quiet_lightning,
    status,
    with_progress_bar,
)
from lightning_unlearn.unlearners import FinetuneUnlearner, RetrainUnlearner

BANNERS = ("GPU available", "TPU available", "`Trainer.fit` stopped", "Tip:")


@pytest.fixture
def lightning_lines():
    """Every record Lightning logs during the test, at any level, wherever its handlers would send it. Lightning's
    loggers start at INFO, their import-time level (an earlier test, e.g. the CLI's, may have raised it)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    names = ("lightning", "lightning.pytorch", "lightning.fabric")  # the last two may not propagate to "lightning"
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    yield records
    for name in names:
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(levels[name])


def trained(train):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, N_CLASSES))
    model, rec = SupervisedClassifier(net, lr=0.1), SampleRecorder()
    quiet_trainer([rec], max_epochs=1).fit(model, DataLoader(train, batch_size=32))
    return model, rec


def banner_lines(text: str, records: list[logging.LogRecord]) -> list[str]:
    lines = text.splitlines() + [r.getMessage() for r in records]
    return [line for line in lines if any(b in line for b in BANNERS)]


def test_the_capture_sees_lightning_banners_outside_quiet_lightning(capfd, lightning_lines):
    """The control: a plain Trainer does log its banners, so their absence below means something."""
    L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    out, err = capfd.readouterr()
    assert any("GPU available" in line for line in banner_lines(out + err, lightning_lines))


@pytest.mark.parametrize("retrain", [False, True])
def test_a_baseline_request_prints_one_status_line_and_no_banner(capfd, lightning_lines, monkeypatch, retrain):
    train = toy_dataset(80)
    model, rec = trained(train)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    if retrain:
        strategy = RetrainUnlearner(model, rec, train, initial, batch_size=32)
    else:
        strategy = FinetuneUnlearner(model, rec, train, epochs=1, batch_size=32)
    capfd.readouterr()
    lightning_lines.clear()
    monkeypatch.setenv(ENV, "0")
    strategy.forget(ForgetRequest.samples([0, 1]))
    out, err = capfd.readouterr()
    assert banner_lines(out + err, lightning_lines) == [] and err.strip() == ""
    monkeypatch.setenv(ENV, "1")
    strategy.forget(ForgetRequest.samples([2, 3]))
    out, err = capfd.readouterr()
    assert banner_lines(out + err, lightning_lines) == []
    expected = "retrain: request 2: retraining" if retrain else "finetune: request 2: training a copy"
    assert [line for line in err.splitlines() if line.strip()] == [
        line for line in err.splitlines() if expected in line
    ]
    assert sum(expected in line for line in err.splitlines()) == 1


def test_quiet_lightning_restores_levels_and_keeps_warnings(lightning_lines):
    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    with quiet_lightning():
        logger.info("dropped")
        logger.warning("kept")
    assert logger.level == before
    assert [r.getMessage() for r in lightning_lines] == ["kept"]


def test_progress_switch(monkeypatch, capfd):
    monkeypatch.setenv(ENV, "off")
    assert not progress_enabled() and progress_enabled(True)
    monkeypatch.setenv(ENV, "1")
    assert progress_enabled() and not progress_enabled(False)
    status("phase one")
    assert capfd.readouterr().err == "phase one\n"
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(ValueError, match=ENV):
        progress_enabled()


def test_progress_bar_is_lightnings_on_a_terminal_and_one_line_per_fit_in_a_pipe(monkeypatch, capfd, lightning_lines):
    """Under pytest stderr is not a terminal: a pipe. A fit with progress_bar() then writes exactly one line (no
    carriage-return updates), and nothing with the switch off; forced on, it is Lightning's own bar."""
    monkeypatch.delenv(ENV, raising=False)
    assert output_mode() == "lines" and isinstance(progress_bar(), StageLines)
    train = toy_dataset(64)

    def fit(bar) -> str:
        capfd.readouterr()
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, N_CLASSES))
        opts = dict(logger=False, enable_checkpointing=False, enable_model_summary=False, max_epochs=2)
        with quiet_lightning():
            L.Trainer(callbacks=[bar], **opts).fit(SupervisedClassifier(net), DataLoader(train, batch_size=16))
        return capfd.readouterr().err

    err = fit(progress_bar())
    assert "\r" not in err and len(err.splitlines()) == 1
    assert err.startswith("fit: 2 epoch(s), 8 steps, train_loss=") and err.rstrip().endswith(" s)")
    monkeypatch.setenv(ENV, "0")
    assert output_mode() == "off" and fit(progress_bar()) == ""
    monkeypatch.setenv(ENV, "1")
    assert isinstance(progress_bar(), TQDMProgressBar)


def test_with_progress_bar_adds_one_unless_the_user_decided(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    rec = SampleRecorder()
    added = with_progress_bar([rec], {})
    assert added[0] is rec and len(added) == 2 and isinstance(added[1], StageLines)
    assert with_progress_bar([rec], {"enable_progress_bar": False}) == [rec]
    own = TQDMProgressBar()
    assert with_progress_bar([rec, own], {}) == [rec, own]
