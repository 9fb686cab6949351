"""A reproduction config from plain data (a parsed YAML file) and back, checked field by field (no torch).

:func:`config_from_dict` builds the typed :class:`~lightning_unlearn_bench.repro.schema.ReproConfig` from
nested mappings and lists, refusing what the schema does not allow with a :class:`ConfigError` that names the
file and the key path (``setups[0].full.lr``); :func:`config_to_dict` writes a config as such data (fields at
their default left out). A setup's ``paper`` numbers are written ``{request label: {paper row: {column:
value}}}``. What needs the registry or the datasets (method names and options, dataset and model names) is
checked when the config runs, before anything is trained.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from lightning_unlearn_bench.repro.columns import COLUMNS
from lightning_unlearn_bench.repro.schema import AGGREGATES, COMPARES, KINDS, PROTOCOLS, ReproConfig, Requests, Scale

T = TypeVar("T")


class ConfigError(ValueError):
    """A reproduction config that does not fit the schema; the message names the file and the key path."""


def config_from_dict(data: Any, source: str = "config") -> ReproConfig:
    """The :class:`ReproConfig` that ``data`` describes (see the module docstring), checked.

    Raises:
        ConfigError: a missing or unknown key, a value of the wrong type, or a value outside its choices
            (protocol, aggregate, column, request kind, ...); naming ``source`` and the key path.
    """
    config = _build(ReproConfig, data, source, "")
    _check_config(config, source)
    return config


def config_to_dict(config: ReproConfig) -> dict[str, Any]:
    """``config`` as plain data: what :func:`config_from_dict` reads back to an equal config."""
    return typing.cast(dict[str, Any], _plain(config))


# -- from data -------------------------------------------------------------------------------------------------------
def _fail(source: str, path: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {path or 'top level'}: {message}")


def _build(cls: type[T], data: Any, source: str, path: str) -> T:
    """A dataclass ``cls`` from a mapping, each field converted to its annotated type."""
    if not isinstance(data, Mapping):
        raise _fail(source, path, f"expected a mapping of {cls.__name__}'s keys, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise _fail(source, _join(path, str(unknown[0])), f"unknown key; {cls.__name__} takes {', '.join(fields)}")
    required = [
        n for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in data]
    if missing:
        raise _fail(source, path, f"missing key(s) {', '.join(missing)} of {cls.__name__}")
    hints = typing.get_type_hints(cls)
    values = {k: _convert(hints[k], v, source, _join(path, k)) for k, v in data.items()}
    return cls(**values)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(kind: Any, value: Any, source: str, path: str) -> Any:
    """``value`` as the annotated type ``kind`` (dataclasses, tuples, mappings, optionals, scalars)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Mapping, dict) and args and args[0] == tuple[str, str]:  # a setup's paper numbers
        return _paper(value, source, path)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, source, path)
    if dataclasses.is_dataclass(kind):
        return _build(typing.cast(type, kind), value, source, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _fail(source, path, f"expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, source, f"{path}[{i}]") for i, v in enumerate(value))
        raise _fail(source, path, f"unsupported type {kind}")  # pragma: no cover (no such field in the schema)
    if origin in (Mapping, dict) or kind in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise _fail(source, path, f"expected a mapping, got {value!r}")
        inner = args[1] if args else Any
        return {str(k): _convert(inner, v, source, _join(path, str(k))) for k, v in value.items()}
    if kind is Any:
        return value
    return _scalar(kind, value, source, path)


def _scalar(kind: Any, value: Any, source: str, path: str) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise _fail(source, path, f"expected true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(source, path, f"expected an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _fail(source, path, f"expected a finite number, got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise _fail(source, path, f"expected text, got {value!r}")
        return value
    raise _fail(source, path, f"unsupported type {kind}")  # pragma: no cover (no such field in the schema)


def _paper(value: Any, source: str, path: str) -> dict[tuple[str, str], dict[str, float]]:
    """``{request label: {paper row: {column: number}}}`` as the schema's ``{(label, row): {column: number}}``."""
    if not isinstance(value, Mapping):
        raise _fail(source, path, "expected {request label: {paper row: {column: number}}}")
    out: dict[tuple[str, str], dict[str, float]] = {}
    for label, rows in value.items():
        if not isinstance(rows, Mapping):
            raise _fail(source, _join(path, str(label)), "expected {paper row: {column: number}}")
        for row, cells in rows.items():
            where = _join(_join(path, str(label)), str(row))
            if not isinstance(cells, Mapping):
                raise _fail(source, where, "expected {column: number}")
            out[(str(label), str(row))] = {
                str(c): _scalar(float, v, source, _join(where, str(c))) for c, v in cells.items()
            }
    return out


# -- checks of values ------------------------------------------------------------------------------------------------
def _check_config(config: ReproConfig, source: str) -> None:
    def choice(path: str, value: str, choices: tuple[str, ...] | list[str]) -> None:
        if value not in choices:
            raise _fail(source, path, f"{value!r} is not one of {', '.join(choices)}")

    choice("aggregate", config.aggregate, AGGREGATES)
    for i, column in enumerate(config.columns):
        choice(f"columns[{i}]", column, list(COLUMNS))
    if not config.setups:
        raise _fail(source, "setups", "a config needs at least one setup")
    labels = [s.label for s in config.setups]
    if len(set(labels)) != len(labels):
        raise _fail(source, "setups", f"setup labels must be unique, got {labels}")
    if not 1 <= config.smoke_setups <= len(config.setups):
        raise _fail(source, "smoke_setups", f"must lie in [1, {len(config.setups)}], got {config.smoke_setups}")
    for i, setup in enumerate(config.setups):
        at = f"setups[{i}]"
        choice(f"{at}.protocol", setup.protocol, PROTOCOLS)
        if not setup.methods:
            raise _fail(source, f"{at}.methods", "a setup needs at least one method")
        names, rows = {e.name for e in setup.methods}, [e.paper_row for e in setup.methods]
        if len(set(rows)) != len(rows):
            raise _fail(source, f"{at}.methods", f"paper rows must be unique, got {rows}")
        scales = {"full": setup.full, "smoke": setup.smoke, "bundled": setup.bundled}
        for name, scale in scales.items():
            if scale is not None:
                _check_scale(scale, f"{at}.{name}", names, rows, choice, source)
        request_labels = {r.label for s in scales.values() if s is not None for r in s.requests}
        for label, row in setup.paper:
            where = f"{at}.paper.{label}"
            if label not in request_labels:
                raise _fail(source, where, f"no request set of this setup is labelled {label!r}")
            for column in setup.paper[(label, row)]:
                choice(f"{where}.{row}.{column}", column, config.columns)


def _check_scale(scale: Scale, at: str, methods: set[str], rows: list[str], choice: Any, source: str) -> None:
    for key in ("epochs", "batch_size", "width", "n_experiences", "labels_per_task"):
        if getattr(scale, key) < 1:
            raise _fail(source, f"{at}.{key}", f"must be at least 1, got {getattr(scale, key)}")
    for key in ("per_class", "train_size", "test_size"):
        if getattr(scale, key) is not None and getattr(scale, key) < 1:
            raise _fail(source, f"{at}.{key}", f"must be at least 1 (or absent: all), got {getattr(scale, key)}")
    if scale.lr <= 0 or scale.pretrain_epochs < 0:
        key = "lr" if scale.lr <= 0 else "pretrain_epochs"
        raise _fail(source, f"{at}.{key}", f"must be {'positive' if key == 'lr' else 'at least 0'}")
    if not scale.requests:
        raise _fail(source, f"{at}.requests", "a scale needs at least one request set")
    for j, requests in enumerate(scale.requests):
        _check_requests(requests, f"{at}.requests[{j}]", choice, source)
    for name in scale.options:
        choice(f"{at}.options.{name}", name, sorted(methods))
    for k, row in enumerate(scale.only or ()):
        choice(f"{at}.only[{k}]", row, rows)


def _check_requests(requests: Requests, at: str, choice: Any, source: str) -> None:
    choice(f"{at}.kind", requests.kind, KINDS)
    choice(f"{at}.compare", requests.compare, COMPARES)
    if requests.k < 1:
        raise _fail(source, f"{at}.k", f"must be at least 1, got {requests.k}")
    if requests.fraction is not None and not 0 < requests.fraction <= 1:
        raise _fail(source, f"{at}.fraction", f"must lie in (0, 1], got {requests.fraction}")
    if requests.per_request is not None and requests.per_request < 1:
        raise _fail(source, f"{at}.per_request", f"must be at least 1, got {requests.per_request}")
    if (requests.tasks or requests.after) and requests.kind != "tasks":
        raise _fail(source, f"{at}.kind", "tasks and after need kind 'tasks'")


# -- to data ---------------------------------------------------------------------------------------------------------
#: keys written first (then the others in the schema's order): what a reader looks for first; notes last
_FIRST = {
    "ReproConfig": ("name", "paper", "table", "protocol", "columns", "aggregate", "smoke_setups", "setups"),
    "Setup": ("label", "protocol", "source", "methods", "full", "bundled", "smoke"),
    "Scale": (
        "dataset",
        "model",
        "width",
        "pretrain_epochs",
        "epochs",
        "lr",
        "batch_size",
        "per_class",
        "train_size",
        "test_size",
        "n_experiences",
        "labels_per_task",
    ),
}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "paper" and isinstance(v, Mapping):
                v = _nested_paper(v)
            elif f.default is not dataclasses.MISSING and v == f.default:
                continue
            elif f.default_factory is not dataclasses.MISSING and v == f.default_factory():
                continue
            out[f.name] = _plain(v)
        first = _FIRST.get(type(value).__name__, ())
        return {k: out[k] for k in (*[k for k in first if k in out], *[k for k in out if k not in first])}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _nested_paper(paper: Mapping[tuple[str, str], Mapping[str, float]]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (label, row), cells in paper.items():
        out.setdefault(label, {})[row] = {c: float(f"{v:.12g}") for c, v in cells.items()}
    return out
