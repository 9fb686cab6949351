"""The lock file installs what pyproject.toml and bench/pyproject.toml ask for: every dependency (extras included) is
pinned there, with a hash, inside its range, and torch/torchvision at constraints.txt's pins. A dependency changed
without ``make lock`` fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parent.parent


def _pins() -> dict[str, tuple[Version, int]]:
    """``{name: (version, number of hashes)}`` of requirements.lock."""
    pins: dict[str, tuple[Version, int]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", (ROOT / "requirements.lock").read_text()):
        head = re.match(r"([A-Za-z0-9_.\-]+)==([^\s\\;]+)", block)
        if head:
            pins[canonicalize_name(head.group(1))] = (Version(head.group(2)), block.count("--hash=sha256:"))
    return pins


#: the repository's two distributions: the library and the bench (the harness and the command)
PROJECTS = (ROOT / "pyproject.toml", ROOT / "bench" / "pyproject.toml")


def _declared() -> list[Requirement]:
    """Every dependency of both distributions (extras included), but the library itself, which the bench requires and
    ``make`` installs from this checkout."""
    quoted, own = [], set()
    for project in PROJECTS:
        text = project.read_text()
        name = re.search(r'^name = "([^"]+)"', text, re.M)
        deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
        extras = re.search(r"^\[project\.optional-dependencies\](.*?)^\[", text, re.S | re.M)
        assert name and deps, project
        own.add(canonicalize_name(name.group(1)))
        quoted += re.findall(r'"([^"]+)"', deps.group(1) + (extras.group(1) if extras else ""))
    requirements = [Requirement(q) for q in quoted]
    return [r for r in requirements if canonicalize_name(r.name) not in own]


PINS = _pins()


@pytest.mark.parametrize("requirement", _declared(), ids=str)
def test_every_declared_dependency_is_pinned_in_range_with_a_hash(requirement: Requirement) -> None:
    name = canonicalize_name(requirement.name)
    assert name in PINS, f"{requirement} is not in requirements.lock: run make lock"
    version, hashes = PINS[name]
    assert version in requirement.specifier, f"requirements.lock pins {name}=={version}, outside {requirement}"
    assert hashes >= 1


def test_torch_pair_is_the_constraint_files() -> None:
    constraints = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line)
    assert {k: str(PINS[k][0]) for k in constraints} == constraints


def test_every_pin_carries_a_hash() -> None:
    assert len(PINS) > 50 and all(hashes for _, hashes in PINS.values())
