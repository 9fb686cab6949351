"""Every Python snippet of the README runs as written (in a scratch directory)."""

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)

pytestmark = pytest.mark.slow


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{k}" for k in range(len(SNIPPETS))])
def test_snippet_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"README.md snippet in {os.getcwd()}", "exec"), {"__name__": "__readme__"})
