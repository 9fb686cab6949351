"""The seed papers' headline tables as reproduction configs: YAML files shipped with the package, one per table.

Each file (``bench/lightning_unlearn_bench/configs/<name>.yaml``; :func:`config_path`) keeps the paper's protocol,
the method settings and metrics of each setup, and the paper's own numbers typed in from the table named in
its ``source``; ``notes`` say where our protocol departs from the paper's (``[interp]``). Each method runs under
its own paper's protocol, against the gold standard of that protocol:

* ``acu-table1`` ([ACU] Table 1): class-incremental CIFAR-10/100 on a frozen backbone pre-trained
  on a disjoint base split; every method updates the same analytic model; the reference is the joint
  ridge fit on the retained data of all experiences so far.
* ``hf-table2``, ``hf-table6`` ([HF] Tables 2 and 6): one dataset, non-continual; 20% of the
  training samples deleted one per request; the reference retrains the recipe once at the end.
* ``safe-table1`` ([SAFE] Table 1): one dataset, 20 rounds of 400 random samples, the columns
  averaged over the rounds, each round against a retrain.
* ``rbm-table2`` ([RBM] Table 2): one dataset, random (10%) and class-wise forgetting.
* ``ccl-table1``, ``ccl-fig2`` ([CCL] Table 1, Fig. 2): MNIST as 30 non-i.i.d. tasks of three labels
  learned with the proximal regulariser; five requests forget whole tasks, each arriving after its task
  ``t_i`` with learning continuing after it (its Table 2, row 1); read at ``T = 30``.

A user copies a file, edits it and runs it by path (``lightning-unlearn reproduce my.yaml``,
:func:`get_config`); it is checked against the schema of :mod:`lightning_unlearn_bench.repro.schema` when
loaded (:class:`~lightning_unlearn_bench.repro.validate.ConfigError` naming the file and the bad key).
Smoke scales use the bundled digits (1,797 real 8x8 images); the MNIST setups (hf-table2, ccl-table1,
ccl-fig2, safe-table1's MNIST row) run the paper's protocol on ``mnist-5k`` when no ``--root`` is given.
Reading the configs imports no torch.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from lightning_unlearn_bench.repro.files import dump_config, load_config
from lightning_unlearn_bench.repro.schema import ReproConfig

__all__ = [
    "CONFIGS",
    "CONFIG_DIR",
    "config_names",
    "config_path",
    "dump_config",
    "get_config",
    "list_configs",
    "load_config",
]

#: the folder of the built-in configs inside the package
CONFIG_DIR = resources.files("lightning_unlearn_bench") / "configs"


def config_names() -> list[str]:
    """The built-in configs' names: the files of :data:`CONFIG_DIR`, in the module docstring's order."""
    names = [f.name[: -len(".yaml")] for f in CONFIG_DIR.iterdir() if f.name.endswith(".yaml")]
    return sorted(names, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))


def config_path(name: str) -> Path:
    """The YAML file of built-in config ``name`` (copy it to edit it).

    Raises:
        ValueError: an unknown name (listing the configs).
    """
    if name not in config_names():
        raise ValueError(f"unknown reproduction config {name!r}; one of {', '.join(config_names())} or a YAML file")
    return Path(str(CONFIG_DIR / f"{name}.yaml"))


def get_config(name: str | Path) -> ReproConfig:
    """A built-in config by name (:data:`CONFIGS`), or the config of a YAML file given by its path.

    Raises:
        ValueError: neither a built-in name nor an existing file (listing the configs).
        ConfigError: a file that does not fit the schema (naming the key).
    """
    if str(name) in CONFIGS:
        return CONFIGS[str(name)]
    if Path(name).is_file():
        return load_config(name)
    raise ValueError(f"unknown reproduction config {str(name)!r}; one of {', '.join(CONFIGS)} or a YAML file")


def list_configs() -> str:
    """One line per built-in config: its name, paper and table, setups (``*``: runs without ``--root`` on bundled
    data) and YAML file."""
    lines = []
    for name, config in CONFIGS.items():
        setups = ", ".join(s.label + ("*" if s.bundled is not None else "") for s in config.setups)
        lines.append(f"{name:12s} {config.paper} {config.table}: {setups}  ({config_path(name)})")
    return "\n".join([*lines, "* runs without --root on bundled data (mnist-5k); copy a file to edit it"])


_ORDER = ("acu-table1", "hf-table2", "hf-table6", "safe-table1", "rbm-table2", "ccl-table1", "ccl-fig2")
#: every built-in config by name, read from its YAML file
CONFIGS: dict[str, ReproConfig] = {name: load_config(config_path(name)) for name in config_names()}
