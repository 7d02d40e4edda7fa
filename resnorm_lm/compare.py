"""``resnorm-lm compare`` / ``make compare``: train what is missing, evaluate all, write tables and plots.

    resnorm-lm compare --recipes prenorm-12l postnorm-12l --profile cpu --seeds 1 2 3

Finished runs are reused, unfinished ones resumed, missing ones trained (each in
its own process, with its progress bar). Writes results/<profile>/compare.md and
compare.csv (one row per recipe: mean and spread over seeds, diverged runs shown
as diverged), loss curves against steps and wall time, and per-layer gradient
norms at initialization and late in training.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from resnorm_lm.data.cache import write_csv_atomic
from resnorm_lm.evaluate import evaluate_paths
from resnorm_lm.recipes import RecipeError, recipe_path, resolve_profile
from resnorm_lm.runs import REPO_ROOT, RunConfig, run_directory

TWELVE_LAYER_PLACEMENTS = [
    "prenorm-12l", "postnorm-12l", "sandwich-12l", "deepnorm-12l", "rezero-12l",
    "mixln-12l", "lns-12l", "b2t-12l", "resi_dual-12l", "noresidual-12l",
]  # fmt: skip
METRICS = ["val_loss", "val_ppl", "val_bpb", "val_word_ppl", "test_ppl", "test_bpb"]


def run_state(run_dir: Path) -> str:
    """'finished' (eval.json from a completed fit), 'unfinished' (a checkpoint to resume) or 'missing'."""
    if (run_dir / "eval.json").is_file() and json.loads((run_dir / "eval.json").read_text()).get("finished"):
        if (run_dir / "checkpoints" / "last.ckpt").is_file():
            return "finished"
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        return "unfinished"
    return "missing"


def train(recipe: str, profile: str, seed: int, root: str, resume: bool, extra: list[str]) -> int:
    cmd = [sys.executable, "-m", "resnorm_lm", "fit", "--recipe", recipe, "--profile", profile]
    cmd += [f"--seed_everything={seed}", f"--run.root={root}", *(["--ckpt_path=last"] if resume else []), *extra]
    print(f"\ncompare: {'resuming' if resume else 'training'} {recipe} ({profile}, seed {seed})", flush=True)
    return subprocess.run(cmd, cwd=REPO_ROOT).returncode


def spread(values: list[float]) -> tuple[float | None, float | None]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None
    return statistics.fmean(finite), (statistics.stdev(finite) if len(finite) > 1 else 0.0)


def aggregate(recipe: str, rows: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    diverged = [r for r in rows if r.get("diverged")]
    good = [r for r in rows if not r.get("diverged")]
    out: dict[str, Any] = {"recipe": recipe, "n_seeds": len(seeds), "n_runs": len(rows), "n_diverged": len(diverged)}
    for key in METRICS:
        out[f"{key}_mean"], out[f"{key}_std"] = spread([r.get(key.replace("val_", "validation_")) for r in good])
    first = (good or rows or [{}])[0]
    out.update({k: first.get(k) for k in ("params", "tokens", "step")})
    tps = [r["tokens_per_s"] for r in good if r.get("tokens_per_s")]
    out["tokens_per_s"] = statistics.fmean(tps) if tps else None
    if diverged:
        out["status"] = f"diverged {len(diverged)}/{len(seeds)}"
    elif len(rows) < len(seeds):
        out["status"] = f"missing {len(seeds) - len(rows)}/{len(seeds)}"
    else:
        out["status"] = "ok"
    return out


def markdown_table(table: list[dict[str, Any]], profile: str, command: str) -> str:
    def num(mean, std, digits=3):
        if mean is None:
            return "diverged"
        return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std else "")

    lines = [f"# Comparison: profile `{profile}`", "", f"Command: `{command}`", "",
             f"Date: {time.strftime('%Y-%m-%d')}. Mean ± standard deviation over seeds; sorted by validation bits "
             "per byte; diverged runs are listed, not dropped.", "",
             "| recipe | val loss | val ppl | val bpb | test ppl | test bpb | params | tokens/s | runs |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in table:
        lines.append(
            f"| {row['recipe']} | {num(row['val_loss_mean'], row['val_loss_std'])} | "
            f"{num(row['val_ppl_mean'], row['val_ppl_std'], 1)} | {num(row['val_bpb_mean'], row['val_bpb_std'])} | "
            f"{num(row['test_ppl_mean'], row['test_ppl_std'], 1)} | {num(row['test_bpb_mean'], row['test_bpb_std'])} | "
            f"{row['params'] or ''} | {row['tokens_per_s'] or 0:.0f} | {row['status']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resnorm-lm compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--recipes", nargs="+", default=TWELVE_LAYER_PLACEMENTS)
    parser.add_argument("--profile", default="auto")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--root", default="runs", help="where the runs live")
    parser.add_argument("--results", default="results", help="where tables and plots go: <results>/<profile>/")
    parser.add_argument("--no-train", action="store_true", help="only evaluate and tabulate runs that exist")
    parser.add_argument("--train-args", default="", help="extra LightningCLI overrides for the training runs")
    args = parser.parse_args(argv)
    try:
        profile = resolve_profile(args.profile)
        for recipe in args.recipes:
            recipe_path(recipe)
    except RecipeError as err:
        print(f"resnorm-lm compare: error: {err}", file=sys.stderr)
        return 2
    started = time.time()
    runs: dict[str, list[Path]] = {}
    for recipe in args.recipes:
        for seed in args.seeds:
            run_dir = run_directory(RunConfig(recipe=recipe, profile=profile, root=args.root), seed)
            state = run_state(run_dir)
            if state != "finished" and not args.no_train:
                code = train(recipe, profile, seed, args.root, state == "unfinished", args.train_args.split())
                if code != 0:
                    print(f"compare: {recipe} seed {seed} ended with exit code {code}", file=sys.stderr)
            if (run_dir / "checkpoints" / "last.ckpt").is_file():
                runs.setdefault(recipe, []).append(run_dir)
    if not runs:
        print("resnorm-lm compare: no runs to compare", file=sys.stderr)
        return 1
    rows = evaluate_paths([str(p) for paths in runs.values() for p in paths], ["validation", "test"], progress=False)
    by_recipe: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_recipe.setdefault(Path(row["run"]).parent.name, []).append(row)
    table = [aggregate(recipe, by_recipe.get(recipe, []), args.seeds) for recipe in args.recipes]
    table.sort(key=lambda r: (r["n_diverged"] > 0 or r["val_bpb_mean"] is None, r["val_bpb_mean"] or math.inf))
    out_dir = Path(args.results) / profile
    out_dir.mkdir(parents=True, exist_ok=True)
    command = (
        f'make compare RECIPES="{" ".join(args.recipes)}" PROFILE={profile} SEEDS="{" ".join(map(str, args.seeds))}"'
    )
    (out_dir / "compare.md").write_text(markdown_table(table, profile, command))
    write_csv_atomic(out_dir / "compare.csv", table)
    from resnorm_lm.plots import plot_grad_norms, plot_loss_curves

    plot_loss_curves(runs, out_dir)
    plot_grad_norms(runs, out_dir)
    print("\n" + (out_dir / "compare.md").read_text())
    print(f"compare: wrote {out_dir}/compare.md, compare.csv and plots in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
