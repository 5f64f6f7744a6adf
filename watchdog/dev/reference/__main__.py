"""``python -m watchdog.dev.reference [ROOT]``: write docs/reference/ under ROOT
(default: the current directory, a checkout's root)."""

from __future__ import annotations

import sys
from pathlib import Path

from .pages import write


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path.cwd()
    if not (root / "pyproject.toml").is_file():
        print(f"{root} is not a checkout's root (no pyproject.toml): pass the root, or run from it", file=sys.stderr)
        return 2
    for path in write(root):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
