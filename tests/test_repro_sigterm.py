"""SIGTERM (``kill``, ``timeout``, a batch scheduler) stops ``reproduce`` at once, inside a Lightning fit or not:
exit status 143, the finished rows kept, one line saying how to resume; ``--resume`` then finishes the table. A
Ctrl-C says the same, with status 130."""

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers_repro import tiny_config
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset

import lightning_unlearn
import lightning_unlearn_bench
from lightning_unlearn.core.interrupts import deferred_interrupts, stop_on_sigterm
from lightning_unlearn_bench import cli
from lightning_unlearn_bench.cli import main

ROWS = [
    "{name: hf, paper_row: A, options: {noise: false, l2: 0.5, lr_margin: 0.9}}",
    "{name: hf, paper_row: B, options: {noise: false, l2: 0.25, lr_margin: 0.9, bound: paper}}",
]


class _Steps(L.LightningModule):
    """A linear model whose training step sends this process a signal (``send``, SIGTERM) at step ``at`` and counts
    the steps run."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.layer, self.at, self.steps, self.send = torch.nn.Linear(2, 1), at, 0, signal.SIGTERM

    def training_step(self, batch, batch_idx):
        self.steps += 1
        if self.steps == self.at:
            os.kill(os.getpid(), self.send)
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_sigterm_inside_a_fit_stops_it_at_once_with_status_143():
    """Lightning alone would finish the step and raise its ``SIGTERMException`` without a status (0)."""
    model = _Steps(at=3)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SIGTERMException) as stop, stop_on_sigterm():
        trainer.fit(model, DataLoader(TensorDataset(torch.ones(100, 2)), batch_size=1))
    assert stop.value.code == 143 and model.steps == 3  # not the 100 steps of the epoch
    assert trainer.received_sigterm  # Lightning's own notifier ran first (it stops a launcher's other ranks)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_held_block_finishes_before_sigterm_stops():
    done = []
    with pytest.raises(SIGTERMException), stop_on_sigterm():
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("written")  # a row's files: written whole
        done.append("after")
    assert done == ["written"]


def test_sigterm_stops_a_run_that_resume_then_finishes(tmp_path, capsys):
    config = tiny_config(tmp_path / "tiny.yaml", ROWS, epochs=3)
    out = tmp_path / "out"
    checkouts = (Path(package.__file__).parents[1] for package in (lightning_unlearn, lightning_unlearn_bench))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, checkouts))}
    command = [sys.executable, "-m", "lightning_unlearn_bench", "reproduce", str(config), "--smoke", "--out", str(out)]
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = out / "LR" / "rows" / "K_2--A.json"
    deadline = time.monotonic() + 120
    while not first.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), run.communicate()[1][-2000:]
    run.send_signal(signal.SIGTERM)  # row B is running: its retrain, its fit or its requests
    stdout, stderr = run.communicate(timeout=60)
    assert run.returncode == 143, stderr[-2000:]
    assert stderr.rstrip().splitlines()[-1] == (
        f"tiny: stopped by SIGTERM; the finished rows are in {out}: run the same command with --resume to finish"
    )
    assert sorted(p.name for p in first.parent.iterdir()) == ["K_2--A.json"]  # A kept, nothing of B
    assert "Partial: 1 of 2 rows" in (out / "summary.md").read_text() and stdout == ""

    assert main([*command[3:], "--resume"]) == 0  # in this process: the same command, resumed
    resumed = capsys.readouterr().err
    assert "LR K=2 A: finished before (resumed)" in resumed and "LR K=2 B: 2 request(s)" in resumed
    table = (out / "summary.md").read_text()
    assert "| hf[noise=off] | A |" in table and "| hf[noise=off,bound=paper] | B |" in table
    assert "Partial" not in table


def _tables_script():
    """``benchmarks/tables.py`` as a module (a script, not part of the package)."""
    path = Path(__file__).parents[1] / "benchmarks" / "tables.py"
    spec = importlib.util.spec_from_file_location("tables_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tables_script_passes_sigterm_on_to_its_run_and_records_its_status(tmp_path):
    """``kill`` of ``benchmarks/tables.py`` reaches the ``reproduce`` it runs (which stops keeping its rows), and
    the script records the status the child ended with (here a child that exits 7 on SIGTERM)."""
    ready = tmp_path / "ready"
    child = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(120)\n"
    )

    def kill_when_ready():
        while not ready.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # to the script (this process), not to the child

    before = signal.getsignal(signal.SIGTERM)
    killer = threading.Thread(target=kill_when_ready)
    killer.start()
    code, wall, cpu = _tables_script().run([sys.executable, "-c", child])
    killer.join()
    assert code == 7 and signal.getsignal(signal.SIGTERM) is before
    # a child ended by a signal: its status as a shell reports it (128 + n)
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert _tables_script().run([sys.executable, "-c", killed])[0] == 128 + signal.SIGKILL


def test_any_command_stopped_by_sigterm_exits_143_saying_so(monkeypatch, capsys):
    def stopped(cfg):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # not reached: the handler raises at once
        return ""

    monkeypatch.setitem(cli._RUN, "compare", stopped)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["compare", "--methods", "[retrain]"]) == 143
    assert capsys.readouterr().err == "\ncompare: stopped by SIGTERM\n"
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_inside_a_fit_stops_reproduce_with_status_130_saying_how_to_resume(tmp_path, monkeypatch, capsys):
    """Lightning turns a Ctrl-C inside a fit into ``sys.exit(1)`` and says so at INFO level only (silent here):
    the command says it stopped and how to resume, with the status a shell gives a Ctrl-C (130)."""

    def interrupted_fit(*args, **kwargs):
        model = _Steps(at=3)
        model.send = signal.SIGINT
        L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(
            model, DataLoader(TensorDataset(torch.ones(100, 2)), batch_size=1)
        )

    monkeypatch.setattr("lightning_unlearn_bench.repro.run.run_config", interrupted_fit)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stop:
        main(["reproduce", "hf-table2", "--smoke", "--out", str(tmp_path)])
    assert stop.value.code == 130 and signal.getsignal(signal.SIGINT) is before
    assert capsys.readouterr().err.endswith(
        f"hf-table2: stopped by Ctrl-C; the finished rows are in {tmp_path}: run the same command with --resume to "
        "finish\n"
    )
