"""Where is OLMo 2's large early gradient? Its parameters' gradient norms at initialization, largest first.

In the suite ``designs-12l`` OLMo 2's global gradient norm at the first logged step is about 409 where pre-norm's is
about 6, and the blocks' weight matrices hold at most 6.97 of it (docs/designs.md, "OLMo 2 judged at 12 blocks").
This probe builds each arm's model from a committed run's ``model.arch`` (OLMo 2's, with the options named), at its
init and seed, and takes one backward pass on random tokens of the run's batch shape, as ``resnorm-lm at-init`` does;
it prints the global gradient norm, its share by kind of parameter and the largest single parameters::

    python scripts/olmo2_gradient_at_init.py [--seeds 1 2 3] [--top 5] [--out docs/results/olmo2-gradient-at-init]

An untrained model on random tokens, not the run's step 10: where the gradient starts, not what it is later.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import yaml

from resnorm_lm.analysis.block_measurements import markdown_table
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.model.gpt import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "docs/results/suites/designs-12l/run-files/olmo2-12l/cpu-lr0.008-wf0.5-seed1/config.yaml"
ARMS = {  # arm: what it changes in OLMo 2's model.arch
    "OLMo 2 (`olmo2-12l`)": {},
    "OLMo 2 without Linear biases (its paper's)": {"bias": False},
    "OLMo 2 on normed embeddings (`olmo2_embed_norm`)": {"placement": "olmo2_embed_norm"},
    "pre-norm (`prenorm-12l`)": {"placement": "prenorm", "norm": "layernorm", "qk_norm": "none"},
}


def kind(name: str, p: torch.Tensor) -> str:
    """The kind of parameter: embeddings, the blocks' weight matrices, Linear biases, norm gains (and biases)."""
    if name.split(".")[-2] in ("wte", "wpe"):
        return "embeddings"
    if p.ndim == 2:
        return "weight matrices"
    return "Linear biases" if name.endswith(".bias") and ".c_" in name else "norm gains and biases"


def gradients_at_init(arch: dict, seed: int, batch: int, vocab: int, length: int) -> dict[str, tuple[str, float]]:
    """Each parameter's kind and gradient norm after one backward pass of a model of ``arch`` at its init and
    ``seed`` on random tokens (B, T + 1)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=length, **arch))
    tokens = torch.Generator().manual_seed(1000 + seed)
    idx = torch.randint(0, vocab, (batch, length + 1), generator=tokens)  # (B, T + 1)
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return {n: (kind(n, p), p.grad.norm().item()) for n, p in model.named_parameters() if p.grad is not None}


KINDS = ("embeddings", "weight matrices", "Linear biases", "norm gains and biases")


def has(grads: dict[str, tuple[str, float]], k: str) -> bool:
    return any(kk == k for kk, _ in grads.values())


def norm(values) -> float:
    return math.sqrt(sum(v * v for v in values))


def summarize(arm: str, grads: dict[str, tuple[str, float]], top: int) -> dict[str, str]:
    """One arm's row: the global norm, each kind's part of it (the norm of its parameters' gradients) and the
    ``top`` largest parameters."""
    largest = sorted(grads.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "arm": arm,
        "global": f"{norm(g for _, g in grads.values()):.3g}",
        **{k: f"{norm(g for kk, g in grads.values() if kk == k):.3g}" if has(grads, k) else "-" for k in KINDS},
        "largest": ", ".join(f"`{n}` {g:.3g}" for n, (_, g) in largest),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--out", type=Path, help="also write the table here as olmo2-gradient-at-init.md")
    args = parser.parse_args(argv)
    config = yaml.safe_load(CONFIG.read_text())
    arch, data = config["model"]["arch"], config["data"]
    rows = [
        summarize(
            f"{arm}, seed {seed}",
            gradients_at_init({**arch, **change}, seed, data["batch_size"], data["vocab_size"], data["block_size"]),
            args.top,
        )
        for arm, change in ARMS.items()
        for seed in args.seeds
    ]
    text = (
        f"Gradient norms after one backward pass at initialization, on random tokens of the run's batch shape "
        f"({data['batch_size']} x {data['block_size']}); the model: `model.arch` of "
        f"`{CONFIG.relative_to(REPO)}` with each arm's change; by kind, the norm of its parameters' gradients.\n\n"
        + markdown_table(rows)
        + "\n"
    )
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_write(args.out / "olmo2-gradient-at-init.md", "w") as f:
            f.write(
                "# OLMo 2's gradient at initialization, by parameter\n\n`python scripts/olmo2_gradient_at_init.py "
                f"--out {args.out}` (scripts/olmo2_gradient_at_init.py says why).\n\n" + text
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
