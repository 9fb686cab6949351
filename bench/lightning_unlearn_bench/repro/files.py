"""A reproduction config as YAML text and back: :func:`load_config` reads a file, checked against the schema
(:mod:`~lightning_unlearn_bench.repro.validate`), and :func:`dump_config` writes the text it reads back to an equal
config (short flat mappings and lists on one line, long text folded). No torch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from lightning_unlearn_bench.repro.schema import ReproConfig
from lightning_unlearn_bench.repro.validate import ConfigError, config_from_dict, config_to_dict


class _Loader(yaml.SafeLoader):
    """YAML 1.1's safe loader that also reads ``1e-5`` (no dot) as a number, as YAML 1.2 and Python do."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


class _Dumper(yaml.SafeDumper):
    """Short flat mappings and lists on one line, long text folded; no anchors (each setup stands alone)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _flat(values: Any) -> bool:
    return all(not isinstance(v, (dict, list)) or (isinstance(v, dict) and _flat(v.values())) for v in values)


def _represent_dict(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    flow = _flat(data.values()) and len(str(data)) < 100
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flat = all(not isinstance(v, (dict, list)) for v in data)
    short = len(str(data)) < 100 and all(
        isinstance(v, list) and all(not isinstance(u, (dict, list)) for u in v) for v in data
    )
    flow = short or (flat and not any(isinstance(v, str) and len(v) > 40 for v in data))
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=">" if len(data) > 100 else None)


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def load_config(path: str | Path) -> ReproConfig:
    """The config of the YAML file ``path``, checked against the schema.

    Raises:
        FileNotFoundError: no such file.
        ConfigError: YAML that does not parse, or does not fit the schema (naming the file and the key path).
    """
    path = Path(path)
    text = path.read_text()
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return config_from_dict(data, str(path))


def dump_config(config: ReproConfig) -> str:
    """``config`` as the YAML text :func:`load_config` reads back to an equal config."""
    return yaml.dump(config_to_dict(config), Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)
