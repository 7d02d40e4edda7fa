"""The reference at a design's compute: a suite whose file says ``compute_of: {suite: <base>, recipe: <design>}``
trains the base suite's reference (pre-norm) for the steps in which it spends what ``<design>`` spends in the base
suite's steps, counted in training FLOPs, under the base suite's protocol and budget otherwise. ``suite.load``
checks it: the reference its only recipe, nothing but ``trainer.max_steps`` differing from the base suite (as for a
second horizon), and that many steps the nearest to ``base steps x FLOPs(design) / FLOPs(reference)``.

FLOPs are counted, not computed from a formula: ``FlopCounterMode`` over one forward and backward of the profile's
model (matrix products and attention; elementwise work such as Sinkhorn's normalisations is not counted), so a
design's extra products (hyper-connections' stream mixing, mHC's projections) count where ``6N + 12LCT`` would miss
them. Beside its table the suite writes ``equal-compute.md`` and ``.csv``: the design against the reference at equal
steps (the base suite's paired difference) and at equal FLOPs (the design's fresh seeds against this suite's, paired
by seed: seed k is the same init and data order in both), each with its 95% interval and verdict. Both are read
from the rendered tables' ``runs.csv``, so render the base suite first; the two tables must share one arithmetic
for their losses to pair, and where they do not the equal-FLOPs difference is left out and the file says why.
"""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resnorm_lm.analysis.evidence import Interval, interval_columns, interval_text, mean_interval, paired_difference
from resnorm_lm.analysis.horizons import horizon_mismatch, provenance_of, verdict, verdict_text
from resnorm_lm.data.cache import atomic_write, write_csv_atomic

if TYPE_CHECKING:
    import torch

    from resnorm_lm.analysis.suite import Suite
    from resnorm_lm.model.gpt import GPT


def counted_flops_per_token(model: GPT, idx: torch.Tensor) -> float:
    """Counted FLOPs of one forward and backward of ``model`` on ``idx`` (B, T), per token."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / idx.numel()


@functools.cache  # counted once a process: suite checks the steps before training and renders with the ratio
def recipe_flops_per_token(recipe: str, profile: str) -> float:
    """The counted training FLOPs per token of ``recipe`` at ``profile``'s shapes (one sequence of full context:
    every count is linear in the batch)."""
    import torch

    from resnorm_lm.model.gpt import GPT
    from resnorm_lm.train.recipes import recipe_arch

    cfg = recipe_arch(recipe, profile)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(cfg)
        idx = torch.randint(cfg.vocab_size, (1, cfg.block_size))
    return counted_flops_per_token(model, idx)


def matched_steps(base: Suite, recipe: str) -> tuple[int, float]:
    """The steps at which ``base``'s reference spends what ``recipe`` spends in ``base``'s steps, and the ratio of
    their counted FLOPs per token."""
    ratio = recipe_flops_per_token(recipe, base.profile) / recipe_flops_per_token(base.reference, base.profile)
    return round(base.max_steps * ratio), ratio


def compute_target(raw: Any) -> tuple[str, str]:
    """A suite file's ``compute_of`` value as (base suite, design recipe), or a ValueError that shows the form."""
    if (
        not isinstance(raw, dict)
        or set(raw) != {"suite", "recipe"}
        or not all(isinstance(v, str) for v in raw.values())
    ):
        raise ValueError(f"compute_of: {{suite: <a suite>, recipe: <one of its recipes>}}, got {raw!r}")
    return raw["suite"], raw["recipe"]


def compute_mismatch(suite: Suite, base: Suite) -> str | None:
    """What keeps ``suite`` from being ``base``'s reference at the compute of its ``compute_of`` recipe (None:
    nothing)."""
    _, recipe = suite.compute_of
    if recipe not in base.recipes or recipe == base.reference:
        return f"recipe {recipe!r}: one of {base.name}'s recipes other than its reference {base.reference}"
    if suite.recipes != [base.reference]:
        return f"recipes: [{base.reference}] only (the reference at {recipe}'s compute), got {suite.recipes}"
    problem = horizon_mismatch(suite, base)
    return None if problem and problem.startswith("trainer.max_steps must differ") else problem


def steps_mismatch(suite: Suite, base: Suite) -> str | None:
    """Whether ``suite``'s trainer.max_steps is the count's (None: it is). Apart from ``compute_mismatch``
    because it builds both models and counts (seconds, not for every ``load``): ``suite`` asks it before it trains
    or renders."""
    recipe = suite.compute_of[1]
    steps, ratio = matched_steps(base, recipe)
    if suite.max_steps == steps:
        return None
    return (
        f"{suite.path}: trainer.max_steps must be {steps} ({base.max_steps} x {ratio:.4f}, {recipe}'s counted "
        f"training FLOPs per token over {base.reference}'s), not {suite.max_steps}"
    )


def read_runs(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def pick_losses(runs: list[dict[str, str]], recipe: str, split: str = "val") -> tuple[dict[int, float], int]:
    """{seed: loss on ``split``} of ``recipe``'s fresh seeds at its pick (runs.csv's role ``pick``) that learned
    (status ``ok``), and how many fresh seeds ran there: a seed that diverged or did not learn is counted apart, as
    in the table. A table rendered before runs.csv had a test column gives no test losses."""
    rows = [r for r in runs if r["recipe"] == recipe and r["role"] == "pick"]
    column = f"{split}_loss"
    learned = {int(r["seed"]): float(r[column]) for r in rows if r["status"] == "ok" and r.get(column)}
    return learned, len(rows)


def pick_of(runs: list[dict[str, str]], recipe: str) -> str:
    found = {(float(r["lr"]), float(r["warmup"])) for r in runs if r["recipe"] == recipe and r["role"] == "pick"}
    return ", ".join(f"{lr:g} / {warmup:g}" for lr, warmup in sorted(found)) or "-"


def arithmetics(lines: list[str]) -> set[str]:
    """The arithmetic fingerprints a rendered table's provenance lines name."""
    return {m.group(1) for line in lines for m in [re.search(r"arithmetic (\w+)", line)] if m}


def comparison_rows(suite: Suite, base: Suite, base_runs: list[dict], own_runs: list[dict], paired: bool) -> list:
    """The design at the base suite's steps against the reference at equal steps (both of the base suite), then
    at equal FLOPs (the reference of this suite: paired only where ``paired``, the tables sharing one arithmetic)."""
    design = suite.compute_of[1]
    ours, ran = pick_losses(base_runs, design)
    ours_test, _ = pick_losses(base_runs, design, "test")
    against = [
        (f"equal steps ({base.max_steps})", base.max_steps, base_runs, True),
        (f"equal FLOPs ({suite.max_steps} steps)", suite.max_steps, own_runs, paired),
    ]
    rows = []
    for what, steps, runs, pairs in against:
        reference, reference_ran = pick_losses(runs, base.reference)
        delta = paired_difference(ours, reference) if pairs and reference else None
        reference_test, _ = pick_losses(runs, base.reference, "test")
        delta_test = paired_difference(ours_test, reference_test) if pairs and reference_test else None
        rows.append(
            {
                "comparison": what,
                "reference_steps": steps,
                "reference_pick": pick_of(runs, base.reference),
                "reference_learned": f"{len(reference)}/{reference_ran}",
                "reference_val": _mean(reference),
                "design_pick": pick_of(base_runs, design),
                "design_learned": f"{len(ours)}/{ran}",
                "design_val": _mean(ours),
                "delta_val": delta,
                "delta_test": delta_test,
                "verdict": verdict(delta),
            }
        )
    return rows


def _mean(values: dict[int, float] | None) -> Interval | None:
    return mean_interval(list(values.values())) if values else None


def equal_compute_markdown(
    suite: Suite, base: Suite, ratio: float, rows: list[dict], provenance: dict, paired: bool
) -> str:
    design, ref = suite.compute_of[1], base.reference
    lines = [
        f"# `{design}` against `{ref}` at equal steps and at equal training FLOPs",
        "",
        f"`{design}` counts {ratio:.4f} times `{ref}`'s training FLOPs per token (FlopCounterMode over one forward "
        f"and backward at the {base.profile} profile's shapes: matrix products and attention; elementwise work not "
        f"counted). In {base.max_steps} steps it spends what `{ref}` spends in {suite.max_steps}: `{suite.name}` "
        f"trains `{ref}` there, tuned with `{base.name}`'s budget, fresh seeds at its pick.",
        "",
        "Provenance of each table (the losses pair only within one arithmetic):",
        "",
        *[f"- {name}: {line}" for name, found in provenance.items() for line in found],
        "",
        "Seeds learned: the fresh seeds at the pick that learned, of those run (one that diverged or stayed near "
        f"the unigram loss is counted apart, as in the tables). Δ val: `{design}` minus `{ref}`, paired by seed "
        "over the fresh seeds both have that learned, mean ± 95% t interval; 'ahead' or 'behind' only where the "
        "interval excludes zero, else a tie (where the end nearer zero rounds to 0.000, the verdict says where it "
        "ends). Δ test: the same on the test split, which chose nothing.",
        "",
        f"| comparison | `{ref}` steps | `{ref}` pick | `{ref}` seeds learned | `{ref}` val | `{design}` pick | "
        f"`{design}` seeds learned | `{design}` val | Δ val | Δ test | verdict |",
        "|---" * 11 + "|",
    ]
    for r in rows:
        cells = [r["comparison"], str(r["reference_steps"]), r["reference_pick"], r["reference_learned"],
                 interval_text(r["reference_val"]), r["design_pick"], r["design_learned"],
                 interval_text(r["design_val"]), interval_text(r["delta_val"], sign=True),
                 interval_text(r["delta_test"], sign=True), verdict_text(r["delta_val"], r["verdict"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if not paired:
        lines += ["", "The two tables do not share one arithmetic: the equal-FLOPs difference is left out (train "
                  "both on one arithmetic, or compare verdicts only)."]  # fmt: skip
    partial = any(r["delta_val"] is None or r["delta_val"].n < 2 for r in rows)
    if partial:
        lines += ["", "PARTIAL: a row without an interval waits for its suite's fresh seeds."]
    return "\n".join(lines) + "\n"


def write_equal_compute(suite: Suite, base: Suite, results: Path) -> list[Path]:
    """equal-compute.md and .csv beside ``suite``'s table, or nothing where the base suite's table has not been
    rendered (said on stdout)."""
    base_runs_csv = results / base.name / "runs.csv"
    if not base_runs_csv.is_file():
        print(f"suite {suite.name}: no {base_runs_csv}: render it first (make suite SUITE={base.name} ARGS=--no-train)")
        return []
    out_dir = results / suite.name
    provenance = {
        base.name: provenance_of(results / base.name / f"{base.name}.md"),
        suite.name: provenance_of(out_dir / f"{suite.name}.md"),
    }
    found = [arithmetics(lines) for lines in provenance.values()]
    paired = len(found[0]) == 1 and found[0] == found[1]
    _, ratio = matched_steps(base, suite.compute_of[1])
    rows = comparison_rows(suite, base, read_runs(base_runs_csv), read_runs(out_dir / "runs.csv"), paired)
    with atomic_write(out_dir / "equal-compute.md", "w") as f:
        f.write(equal_compute_markdown(suite, base, ratio, rows, provenance, paired))
    write_csv_atomic(out_dir / "equal-compute.csv", [interval_columns(r) for r in rows])
    return [out_dir / "equal-compute.md", out_dir / "equal-compute.csv"]
