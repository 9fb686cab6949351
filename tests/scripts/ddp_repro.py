"""Run a reproduction config's smoke scale through the CLI with ``--accelerator cpu --devices N`` (gloo).

Usage: python ddp_repro.py OUT_DIR DEVICES. Run by tests/test_repro_ddp.py in a subprocess: Lightning's "ddp"
strategy relaunches this script for the other rank, which runs the whole command too. Each rank saves
``OUT_DIR.rank<r>.json``: the world size of every ``Trainer`` it fitted and every file it opened for writing
under OUT_DIR (seen through an audit hook, so no way of writing escapes it).
"""

import json
import os
import sys
from pathlib import Path

import lightning as L

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from helpers import ddp_repro_config

from lightning_unlearn_bench import papers
from lightning_unlearn_bench.cli import main as cli

_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def main(out: str, devices: int) -> None:
    config = ddp_repro_config()
    papers.CONFIGS[config.name] = config
    opened: list[str] = []
    under = os.path.abspath(out) + os.sep

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            mode, flags = args[1], args[2]
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE)
            if writing and path.startswith(under):
                opened.append(os.path.relpath(path, out))

    sys.addaudithook(audit)
    fits: list[int] = []
    fit = L.Trainer.fit

    def recorded(trainer: L.Trainer, *args, **kwargs):
        fits.append(trainer.world_size)
        return fit(trainer, *args, **kwargs)

    L.Trainer.fit = recorded
    trainer = ["--trainer.accelerator", "cpu", "--trainer.devices", str(devices)]
    cli(["reproduce", config.name, "--smoke", "--out", out, *trainer])
    record = {"fits": list(fits), "opened": list(opened)}
    Path(f"{out}.rank{os.environ.get('LOCAL_RANK', '0')}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
