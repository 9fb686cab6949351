"""``make test-latest``: ``secure_bytes`` on the newest release of every major version of ``cryptography`` that
pyproject.toml's range allows, each installed into a throwaway venv layered over the running one (its site-packages
come first, so only ``cryptography`` differs). Exit status 1 names the versions whose keystream is wrong or that raise.

Run as ``python tests/scripts/cryptography_majors.py`` from the repository root, with the package installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import tempfile
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import os
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from lightning_unlearn.privacy import noise
key, nonce = bytes(range(32)), bytes(range(100, 116))
given = iter([key, nonce])
noise.os.urandom = lambda n: next(given)
n = 3 * noise._CHUNK + 12_345  # several chunks and a partial one
expected = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(n))
assert noise.secure_bytes(n) == expected, "secure_bytes is not the ChaCha20 keystream"
import cryptography; print("cryptography", cryptography.__version__, "ok")
"""


def allowed_majors() -> list[Version]:
    """The newest release of each major version in the installed package's ``cryptography`` range."""
    spec = next(r for r in map(Requirement, requires("lightning-unlearn") or []) if r.name == "cryptography").specifier
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "cryptography"], capture_output=True, text=True, check=True
    ).stdout
    versions = [Version(v) for v in re.search(r"Available versions: (.*)", listing).group(1).split(", ")]  # type: ignore[union-attr]
    newest: dict[int, Version] = {}
    for v in versions:
        if v in spec and not v.is_prerelease and v > newest.get(v.major, Version("0")):
            newest[v.major] = v
    return sorted(newest.values())


def main() -> int:
    failed = []
    site = sysconfig.get_paths()["purelib"]
    for version in allowed_majors():
        with tempfile.TemporaryDirectory() as tmp:
            venv = Path(tmp) / "venv"
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
            layer = next((venv / "lib").glob("python*/site-packages"))
            (layer / "running.pth").write_text(site + "\n")
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-t", str(layer)]
            subprocess.run([*pip, f"cryptography=={version}"], check=True)
            run = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK], cwd=ROOT, capture_output=True, text=True)
            print(run.stdout.strip() or f"cryptography {version} FAILED:\n{run.stderr.strip()[-2000:]}")
            if run.returncode:
                failed.append(str(version))
    if failed:
        print(f"secure_bytes fails with cryptography {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
