"""``python -m resnorm_lm.data prepare --corpus shakespeare`` (``make data DATA=<corpus>``).

Prepares a corpus (download or load, tokenizer, token bins) and prints its
manifest as JSON on stdout; progress goes to stderr. Known failures print one
line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys

from resnorm_lm.data.corpora import CORPORA
from resnorm_lm.data.errors import DataError
from resnorm_lm.data.prepare import prepare, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resnorm_lm.data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="prepare a corpus and print its manifest")
    p.add_argument("--corpus", default="shakespeare", help=f"one of: {', '.join(CORPORA.names())}")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--files", nargs="+", help="paths or globs (data.corpus=text)")
    p.add_argument("--cache-dir", help="default: $RESNORM_LM_CACHE or ~/.cache/resnorm-lm")
    p.add_argument("--dtype", default="auto", choices=["auto", "uint16", "uint32"])
    p.add_argument("--max-chars", type=int, help="character budget for streamed corpora (fineweb-edu)")
    p.add_argument("--path", help="dataset path replacing a Hub corpus's name (a local mirror)")
    args = parser.parse_args(argv)
    try:
        prepared = prepare(
            args.corpus,
            files=args.files,
            vocab_size=args.vocab_size,
            cache_dir=args.cache_dir,
            dtype=args.dtype,
            max_chars=args.max_chars,
            path=args.path,
        )
    except (DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    json.dump(summary(prepared), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
