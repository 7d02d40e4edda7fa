"""``resnorm-lm generate``: sample text from a trained run, streamed to stdout.

resnorm-lm generate runs/prenorm-12l/cpu-seed1 --prompt "ROMEO." --tokens 200 --temperature 0.8 --top_k 50
"""

from __future__ import annotations

import argparse
import sys

import torch

from resnorm_lm.model.decoding import stream_text
from resnorm_lm.train.loaded_run import CheckpointError, load_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", help="a run directory (its last.ckpt), a .ckpt file, or a resnorm-lm export folder")
    parser.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top_k", type=int, default=50, help="0: no top-k cut")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--greedy", action="store_true", help="the most likely token each time (no sampling)")
    args = parser.parse_args(argv)
    if args.temperature <= 0 or args.tokens < 0 or args.top_k < 0:
        parser.error("--temperature must be > 0, --tokens and --top_k >= 0")
    try:
        run = load_run(args.run)  # refuses data that is not what the run trained on: its tokenizer must match
    except CheckpointError as err:
        print(f"resnorm-lm generate: error: {err}", file=sys.stderr)
        return 2
    dm = run.datamodule
    tokenizer = dm.prepared.tokenizer
    eot = dm.manifest.eot_id
    prompt_ids = [eot] + (tokenizer.encode(args.prompt).ids if args.prompt else [])
    generator = torch.Generator().manual_seed(args.seed)
    sys.stdout.write(args.prompt)
    for piece in stream_text(
        run.model.model,
        tokenizer,
        prompt_ids,
        args.tokens,
        args.temperature,
        args.top_k or None,
        generator,
        args.greedy,
    ):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
