"""The ``lightning-unlearn`` command (also ``python -m lightning_unlearn_bench``).

``reproduce --list`` is answered from the reproduction configs' YAML files alone (no torch, no Lightning); every
other command goes to :func:`lightning_unlearn_bench.cli.main`, whose parser reads Lightning's ``Trainer`` signature and
every registered method's options, so importing it imports Lightning and every method.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["reproduce", "--list"]:
        from lightning_unlearn_bench.papers import list_configs

        print(list_configs())
        return 0
    from lightning_unlearn_bench.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
