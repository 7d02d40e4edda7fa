"""The `resnorm-lm` command (LightningCLI lands with the training issue)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("resnorm-lm: the training CLI (fit, validate, test) is not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
