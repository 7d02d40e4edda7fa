"""A suite's tables: its rows with their intervals (``evidence.py``), its provenance, and the files it writes.

tuned: one row per recipe at its pick, over the fresh seeds only (the selection seed chose and is not reported):
failures (stuck or diverged) as k of n with Wilson's interval, and apart from them the validation and test loss of
the runs that learned, each a mean with its 95% t interval; the paired difference from the reference, seed by seed;
groups of rows the paired intervals do not separate; the LRs within ``lr_tolerance`` of the best at the selection
seed (how forgiving the recipe is); the runs spent against the budget; the runner-up against the pick on the seeds
both have.

seeds: for each recipe, the spread of the final validation loss when seed k varies the init and the data order,
only the init, or only the data order; and how much pairing by seed narrows a difference's interval.

The figures: each recipe's LR sensitivity in a panel of its own with the pick's interval, the paired differences
from the reference as a forest plot, the stream-mix gain of HC and mHC over training (``stream_gain.py``), and the
seed pilot's spread by what varies.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resnorm_lm.analysis.depth_balance import balance_rows, balance_table
from resnorm_lm.analysis.evidence import (
    Interval,
    Proportion,
    TableProvenance,
    groups,
    interval_columns,
    interval_text,
    mean_interval,
    paired_difference,
    t_quantile,
)
from resnorm_lm.analysis.gradient_record import gradient_rows, gradient_table
from resnorm_lm.analysis.plots import forest_plot, panels, save_figure
from resnorm_lm.analysis.stream_gain import gain_rows, gain_table, plot_gain
from resnorm_lm.analysis.sweep import NOT_LEARNING_NATS, RunOutcome, RunSpec, Setting
from resnorm_lm.data.cache import atomic_write, write_csv_atomic
from resnorm_lm.train.diagnostics import TRAIN_LOSS, VAL_LOSS
from resnorm_lm.train.runs import RunDir

if TYPE_CHECKING:
    from resnorm_lm.analysis.drawn_recipes import DrawRule
    from resnorm_lm.analysis.suite import Suite
    from resnorm_lm.analysis.suite_designs import SeedPilot, TunedBudget


def status_of(outcome: RunOutcome, unigram: float) -> str:
    """One rule for every recipe: 'diverged', 'not learning' (within NOT_LEARNING_NATS of the unigram loss, or
    above), or 'ok'."""
    if outcome.diverged:
        return "diverged"
    return "not learning" if outcome.not_learning(unigram) else "ok"


def _lr(x: float) -> str:
    return f"{x:g}"


def lr_range(scores: dict[Setting, float], pick: Setting, tolerance: float) -> str:
    """The contiguous LRs around the pick, at its warmup, scoring within ``tolerance`` of it at the selection
    seed: '2e-3..8e-3 (4x)'."""
    row = sorted((s.lr, v) for s, v in scores.items() if s.warmup == pick.warmup)
    lrs = [lr for lr, _ in row]
    best = scores[pick]
    i = j = lrs.index(pick.lr)
    while i > 0 and row[i - 1][1] <= best + tolerance:
        i -= 1
    while j + 1 < len(row) and row[j + 1][1] <= best + tolerance:
        j += 1
    if i == j:
        return f"{_lr(lrs[i])} only"
    return f"{_lr(lrs[i])}..{_lr(lrs[j])} ({lrs[j] / lrs[i]:.0f}x)"


TRAIN_TAIL = 0.1  # the training loss at a run's end: the mean of its logged batch losses over the last 10% of steps


def fit_of(run_dir: Path) -> dict[str, float] | None:
    """How a finished run fits its training data, from its metrics.csv: ``train`` (the batch losses logged over
    the last ``TRAIN_TAIL`` of its steps, averaged), ``val`` (its last validation), ``best_val`` and ``best_step``
    (its lowest validation and where); None without both kinds of rows."""
    rows = RunDir(run_dir).metrics()
    train = [(r["step"], r[TRAIN_LOSS]) for r in rows if TRAIN_LOSS in r and "step" in r]
    val = [(r["step"], r[VAL_LOSS]) for r in rows if VAL_LOSS in r and "step" in r]
    if not train or not val:
        return None
    end = train[-1][0]
    tail = [loss for step, loss in train if step >= end * (1 - TRAIN_TAIL)]
    best_step, best = min(val, key=lambda p: p[1])
    return {"train": statistics.fmean(tail), "val": val[-1][1], "best_val": best, "best_step": best_step}


class TunedReport:
    """The rows of a tuned suite (see the module's docstring)."""

    def __init__(
        self, suite: Suite, design: TunedBudget, outcomes: dict[RunSpec, RunOutcome], root: str, unigram: float
    ) -> None:
        self.suite, self.design, self.outcomes, self.root, self.unigram = suite, design, outcomes, root, unigram
        self.selections = {r: design.select(r, outcomes)[0] for r in suite.recipes}

    def run_dir(self, spec: RunSpec) -> Path:
        return spec.run_dir(self.root, self.suite.profile)

    def fresh(self, recipe: str, setting: Setting | None, seeds: list[int]) -> dict[int, RunOutcome]:
        if setting is None:
            return {}
        found = {k: self.outcomes.get(RunSpec(recipe, setting, k)) for k in seeds}
        return {k: o for k, o in found.items() if o is not None}

    def learned_runs(self, recipe: str) -> list[Path]:
        """The run directories of the pick's fresh seeds that learned, by seed."""
        sel = self.selections[recipe]
        found = self.fresh(recipe, sel.pick, self.design.seeds).values()
        return [self.run_dir(o.spec) for o in found if status_of(o, self.unigram) == "ok"]

    def learned(self, recipe: str, split: str = "val") -> dict[int, float]:
        """{seed: loss} of the pick's fresh seeds that learned (validation from training, test from eval)."""
        sel = self.selections[recipe]
        out = {}
        for k, o in self.fresh(recipe, sel.pick, self.design.seeds).items():
            if status_of(o, self.unigram) != "ok":
                continue
            if split == "val":
                out[k] = o.val_loss
            elif (test := self.test_loss(o.spec)) is not None:
                out[k] = test
        return out

    def metric(self, recipe: str, key: str) -> Interval | None:
        """A mean with its interval over the learned fresh seeds: val_ppl, val_bpb from eval.json; test_* from
        its test evaluation."""
        values = []
        sel = self.selections[recipe]
        for o in self.fresh(recipe, sel.pick, self.design.seeds).values():
            if status_of(o, self.unigram) != "ok":
                continue
            summary = RunDir(self.run_dir(o.spec)).summary()
            split, name = key.split("_", 1)
            value = summary.get(key) if split == "val" else ((summary.get("eval") or {}).get("test") or {}).get(name)
            if value is not None:
                values.append(value)
        return mean_interval(values)

    def rows(self) -> list[dict[str, Any]]:
        reference_val, reference_test = self.learned(self.suite.reference), self.learned(self.suite.reference, "test")
        rows = []
        for recipe in self.suite.recipes:
            sel, d = self.selections[recipe], self.design
            spent = sum(1 for spec in self.outcomes if spec.recipe == recipe)
            row: dict[str, Any] = {"recipe": recipe, "runs": spent, "max_runs": d.max_runs}
            row["settings_learned"] = self.settings_learned(recipe)
            if sel.pick is None:
                grid = d.grid(recipe)
                done = sum(1 for s in grid if RunSpec(recipe, s, d.selection_seed) in self.outcomes)
                row["status"] = (
                    f"selection: {done}/{len(grid)} grid runs" if not sel.complete else "diverged at every setting"
                )
                rows.append(row)
                continue
            fresh = self.fresh(recipe, sel.pick, d.seeds)
            failures = [o for o in fresh.values() if status_of(o, self.unigram) != "ok"]
            val, test = self.learned(recipe), self.learned(recipe, "test")
            row.update(
                lr=sel.pick.lr,
                warmup=sel.pick.warmup,
                lr_edge=sel.lr_edge,
                seeds=len(fresh),
                failures=Proportion(len(failures), len(fresh)),
                val_loss=mean_interval(list(val.values())),
                test_loss=mean_interval(list(test.values())),
                val_ppl=self.metric(recipe, "val_ppl"),
                test_ppl=self.metric(recipe, "test_ppl"),
                val_bpb=self.metric(recipe, "val_bpb"),
                test_bpb=self.metric(recipe, "test_bpb"),
                lr_range=lr_range(sel.scores, sel.pick, d.lr_tolerance),
                failure_kinds=", ".join(sorted({status_of(o, self.unigram) for o in failures})),
            )
            if recipe != self.suite.reference:
                row["delta_val"] = paired_difference(val, reference_val)
                row["delta_test"] = paired_difference(test, reference_test)
            row["runner_up"] = self.runner_up(recipe)
            row.update(self.fit(recipe))
            missing = len(d.seeds) - len(fresh)
            row["status"] = "partial: " + f"{len(fresh)}/{len(d.seeds)} fresh seeds" if missing else "complete"
            rows.append(row)
        ranked = sorted(
            rows, key=lambda r: (r.get("val_loss") is None, r["val_loss"].mean if r.get("val_loss") else math.inf)
        )
        names = [r["recipe"] for r in ranked if r.get("val_loss")]
        separated = {(p["better"], p["worse"]) for p in self.pair_rows(names) if p["separated"]}
        letters = groups(names, lambda a, b: (a, b) in separated or (b, a) in separated)
        for row in ranked:
            row["group"] = letters.get(row["recipe"], "")
        return ranked

    def pair_rows(self, ranked: list[str]) -> list[dict[str, Any]]:
        """Every pair of ranked rows (best first) with its paired difference on validation, the lower-ranked minus
        the higher over the seeds where both learned: what the group letters rest on (pairs.csv)."""
        losses = {r: self.learned(r) for r in ranked}
        out = []
        for i, better in enumerate(ranked):
            for worse in ranked[i + 1 :]:
                d = paired_difference(losses[worse], losses[better])
                difference = {"delta_val": d} if d else {}  # none under two shared seeds
                out.append(dict(better=better, worse=worse, **difference, separated=bool(d and d.excludes_zero())))
        return out

    def settings_learned(self, recipe: str) -> str:
        """'9/13': of the settings run at the selection seed (the grid so far and its extensions, one run each), how
        many learned: how wide the range of settings is in which the recipe trains at all."""
        seed = self.design.selection_seed
        found = [o for s in self.selections[recipe].scores if (o := self.outcomes.get(RunSpec(recipe, s, seed)))]
        return f"{sum(status_of(o, self.unigram) == 'ok' for o in found)}/{len(found)}" if found else "-"

    def fit(self, recipe: str) -> dict[str, Any]:
        """Over the pick's fresh seeds that learned: the training loss at the end, the validation-minus-training
        gap, and whether validation turned up before the end (how many seeds; by how much; the best steps)."""
        fits = [f for run in self.learned_runs(recipe) if (f := fit_of(run))]
        if not fits:
            return {}
        turned = [f for f in fits if f["val"] > f["best_val"]]
        return {
            "train_loss": mean_interval([f["train"] for f in fits]),
            "gap": mean_interval([f["val"] - f["train"] for f in fits]),
            "val_turned_up": Proportion(len(turned), len(fits)),
            "val_rise": mean_interval([f["val"] - f["best_val"] for f in turned]) if turned else None,
            "best_steps": ", ".join(f"{f['best_step']:.0f}" for f in turned),
        }

    def runner_up(self, recipe: str) -> str:
        """'4e-3/0.25: +0.012 ± 0.030 (2 seeds)': the runner-up minus the pick on the seeds both have."""
        sel = self.selections[recipe]
        if sel.runner_up is None:
            return "-"
        ups = {
            k: o.val_loss
            for k, o in self.fresh(recipe, sel.runner_up, self.design.runner_up_seeds).items()
            if status_of(o, self.unigram) == "ok"
        }
        picks = {
            k: o.val_loss
            for k, o in self.fresh(recipe, sel.pick, self.design.runner_up_seeds).items()
            if status_of(o, self.unigram) == "ok"
        }
        diff = paired_difference(ups, picks)
        where = f"{_lr(sel.runner_up.lr)}/{sel.runner_up.warmup:g}"
        return (
            f"{where}: {interval_text(diff, sign=True)} ({diff.n} seed{'s' if diff.n > 1 else ''})"
            if diff
            else f"{where}: -"
        )

    def grid_rows(self) -> list[dict[str, Any]]:
        """Every finished run: recipe, setting, seed, its role, validation loss, test loss (the pick's fresh seeds
        only: the test split chooses nothing) and status."""
        out = []
        for spec, o in sorted(
            self.outcomes.items(), key=lambda x: (self.suite.recipes.index(x[0].recipe), x[0].setting, x[0].seed)
        ):
            sel = self.selections[spec.recipe]
            role = (
                "selection"
                if spec.seed == self.design.selection_seed
                else "pick"
                if spec.setting == sel.pick
                else "runner-up"
                if spec.setting == sel.runner_up
                else "superseded"
            )
            if spec.seed == self.design.selection_seed and spec.setting in sel.extensions:
                role = "extension"
            out.append(
                {
                    "recipe": spec.recipe,
                    "lr": spec.setting.lr,
                    "warmup": spec.setting.warmup,
                    "seed": spec.seed,
                    "role": role,
                    "val_loss": o.val_loss,
                    "test_loss": self.test_loss(spec) if role == "pick" else None,
                    "status": status_of(o, self.unigram),
                }
            )
        return out

    def test_loss(self, spec: RunSpec) -> float | None:
        """A run's loss on the test split, where it was evaluated there (the picks' fresh seeds only)."""
        return ((RunDir(self.run_dir(spec)).summary().get("eval") or {}).get("test") or {}).get("loss")


def drawn_line(rule: DrawRule) -> str:
    also = f", and {', '.join(f'`{r}`' for r in rule.also)} whatever their rank" if rule.also else ""
    return (
        f"Recipes: drawn by the suite file's rule from `{rule.table}`, written before that table was complete: its "
        f"{rule.best} best by validation loss{also}."
    )


def tuned_markdown(report: TunedReport, rows: list[dict], provenance: TableProvenance, partial: bool) -> str:
    suite, d = report.suite, report.design
    total = sum(r["runs"] for r in rows)
    lines = [
        f"# Suite `{suite.name}`{' (PARTIAL)' if partial else ''}",
        "",
        suite.about,
        "",
        f"Rendered {time.strftime('%Y-%m-%d %H:%M')} from {total} runs (at most {d.max_runs} a recipe). "
        f"Suite file: `{suite.path.name}`.",
        "",
        "Provenance (one arithmetic per table):",
        "",
    ]
    lines += [f"- {line}" for line in provenance.lines()]
    lines += [
        "",
        f"Protocol: profile `{suite.profile}`; every run with "
        + ", ".join(f"`{a[2:]}`" for a in suite.train_args())
        + f". Budget: {d.grid_text()} x warmup fractions "
        f"{', '.join(f'{w:g}' for w in d.warmups)} at selection seed {d.selection_seed}; up to "
        f"{d.extensions} one-point LR extensions beyond an edge pick; then seeds "
        f"{', '.join(map(str, d.seeds))} at the pick and {', '.join(map(str, d.runner_up_seeds))} at the "
        "runner-up. The selection seed is not reported.",
        *(["", drawn_line(suite.drawn_by)] if suite.drawn_by else []),
        "",
        "Numbers: the fresh seeds at the pick. Loss: mean ± 95% t interval over the seeds that learned; "
        f"failures (not learning: within {NOT_LEARNING_NATS} nats of the unigram loss {report.unigram:.3f}, or "
        "diverged) counted apart, k/n with Wilson's 95% interval. Δ: paired by seed against "
        f"`{suite.reference}`, mean ± 95% t interval. Rows sharing a letter are not separated by their "
        f"paired intervals (95%, not adjusted for multiple comparisons). LR range: the LRs within "
        f"{d.lr_tolerance:g} nats of the pick at the selection seed, at its warmup (one seed each). Settings "
        "learned: of the settings run at the selection seed (grid and extensions, one seed each), those that learned.",
        "",
    ]
    mixed = len(provenance.labels) > 1
    head = [
        "recipe",
        "group",
        "lr",
        "warmup",
        "seeds",
        "failures",
        "val loss",
        "Δ val",
        "test loss",
        "Δ test",
        "val bpb",
        "test ppl",
        "LR range",
        "settings learned",
        "runner-up (Δ val)",
        "runs",
        "status",
    ] + (["provenance"] if mixed else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lr = "-" if r.get("lr") is None else _lr(r["lr"]) + (f" ({r['lr_edge']} of grid)" if r.get("lr_edge") else "")
        fails = (
            r["failures"].text() + (f" {r['failure_kinds']}" if r.get("failure_kinds") else "")
            if r.get("failures")
            else "-"
        )
        cells = [
            f"`{r['recipe']}`",
            r.get("group") or "-",
            lr,
            "-" if r.get("warmup") is None else f"{r['warmup']:g}",
            str(r.get("seeds", 0)),
            fails,
            interval_text(r.get("val_loss")),
            interval_text(r.get("delta_val"), sign=True) if r["recipe"] != suite.reference else "reference",
            interval_text(r.get("test_loss")),
            interval_text(r.get("delta_test"), sign=True) if r["recipe"] != suite.reference else "reference",
            interval_text(r.get("val_bpb")),
            interval_text(r.get("test_ppl"), 1),
            r.get("lr_range", "-"),
            r.get("settings_learned", "-"),
            r.get("runner_up", "-"),
            f"{r['runs']}/{r['max_runs']}",
            r["status"],
        ]
        if mixed:
            cells.append(provenance.row_mark(r["recipe"]))
        lines.append("| " + " | ".join(cells) + " |")
    tables = (
        ties_table(report, rows)
        + fit_table(rows)
        + balance_table(balance_rows(report))
        + gradient_table(gradient_rows(report))
        + gain_table(gain_rows(report))
    )
    return "\n".join(lines + tables) + "\n"


def ties_table(report: TunedReport, rows: list[dict[str, Any]]) -> list[str]:
    """The pairs that share a letter because their paired interval includes zero, rows apart in the ranking
    included (every pair, separated or not: pairs.csv)."""
    ties = [p for p in report.pair_rows([r["recipe"] for r in rows if r.get("val_loss")]) if not p["separated"]]
    if not ties:
        return []
    lines = [
        "",
        "Ties (what the letters rest on): the pairs of rows whose paired interval on validation includes zero, "
        "the lower-ranked row minus the higher over the seeds where both learned; every pair: pairs.csv.",
        "",
        "| higher | lower | Δ val | seeds |",
        "|---|---|---|---|",
    ]
    for p in ties:
        d = p.get("delta_val")
        lines.append(f"| `{p['better']}` | `{p['worse']}` | {interval_text(d, sign=True)} | {d.n if d else 0} |")
    return lines


def fit_table(rows: list[dict[str, Any]]) -> list[str]:
    """The second table: how each pick fits its training data, and whether validation turned up before the end."""
    lines = [
        "",
        f"Fit (the same seeds): the training loss at the end (the logged batch losses of the last {TRAIN_TAIL:.0%} "
        "of steps, averaged), validation minus training, and the seeds whose validation was lower at an earlier "
        "evaluation than at the end (by how much, and the step of their best).",
        "",
        "| recipe | train loss | val - train | validation turned up | final - best val | best at step |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("train_loss") is None:
            continue
        lines.append(
            f"| `{r['recipe']}` | {interval_text(r['train_loss'])} | {interval_text(r['gap'], sign=True)} | "
            f"{r['val_turned_up'].text()} | {interval_text(r.get('val_rise'), sign=True)} | "
            f"{r.get('best_steps') or '-'} |"
        )
    return lines


# ---------------------------------------------------------------------------------------- the seed pilot


class PilotReport:
    """The seed pilot's numbers (see the module's docstring)."""

    def __init__(self, suite: Suite, design: SeedPilot, outcomes: dict[RunSpec, RunOutcome], unigram: float) -> None:
        self.suite, self.design, self.outcomes, self.unigram = suite, design, outcomes, unigram

    def values(self, recipe: str, group: str) -> dict[int, float]:
        """{seed: final validation loss} of the group's runs that learned."""
        out = {}
        for spec in self.design.cells(recipe)[group]:
            o = self.outcomes.get(spec)
            if o is not None and status_of(o, self.unigram) == "ok":
                out[spec.seed] = o.val_loss
        return out

    def failures(self, recipe: str) -> list[str]:
        found = []
        for group, specs in self.design.cells(recipe).items():
            for spec in specs:
                o = self.outcomes.get(spec)
                if o is not None and status_of(o, self.unigram) != "ok":
                    found.append(f"{group} seed {spec.seed}: {status_of(o, self.unigram)} ({o.val_loss})")
        return found

    def spread_rows(self) -> list[dict[str, Any]]:
        rows = []
        for recipe in self.suite.recipes:
            setting = self.design.settings[recipe]
            for group in self.design.GROUPS:
                values = list(self.values(recipe, group).values())
                rows.append(
                    {
                        "recipe": recipe,
                        "lr": setting.lr,
                        "warmup": setting.warmup,
                        "varies": group,
                        "n": len(values),
                        "mean": statistics.fmean(values) if values else None,
                        "sd": statistics.stdev(values) if len(values) > 1 else None,
                    }
                )
        return rows

    def pairing_rows(self) -> list[dict[str, Any]]:
        """Each recipe against the reference, in each group: the sd of the paired differences against the sd an
        unpaired difference would have, and the interval half-widths both ways."""
        rows = []
        reference = self.suite.reference
        for recipe in self.suite.recipes:
            if recipe == reference:
                continue
            for group in self.design.GROUPS:
                a, b = self.values(recipe, group), self.values(reference, group)
                common = sorted(set(a) & set(b))
                if len(common) < 2:
                    continue
                diffs = [a[k] - b[k] for k in common]
                n = len(common)
                sd_paired = statistics.stdev(diffs)
                sd_unpaired = math.sqrt(
                    statistics.variance([a[k] for k in common]) + statistics.variance([b[k] for k in common])
                )
                t = t_quantile(0.975, n - 1)
                rows.append(
                    {
                        "recipe": recipe,
                        "reference": reference,
                        "varies": group,
                        "n": n,
                        "mean_difference": statistics.fmean(diffs),
                        "sd_paired": sd_paired,
                        "sd_unpaired": sd_unpaired,
                        "half_width_paired": t * sd_paired / math.sqrt(n),
                        "half_width_unpaired": t * sd_unpaired / math.sqrt(n),
                        "shared": 1 - sd_paired**2 / sd_unpaired**2 if sd_unpaired else None,
                    }
                )
        return rows


def pilot_markdown(report: PilotReport, provenance: TableProvenance, partial: bool) -> str:
    suite, d = report.suite, report.design
    spread, pairing = report.spread_rows(), report.pairing_rows()
    lines = [
        f"# Seed pilot `{suite.name}`{' (PARTIAL)' if partial else ''}",
        "",
        suite.about,
        "",
        f"Rendered {time.strftime('%Y-%m-%d %H:%M')}. Suite file: `{suite.path.name}`.",
        "",
        "Provenance:",
        "",
    ]
    lines += [f"- {line}" for line in provenance.lines()]
    lines += [
        "",
        "Every run with " + ", ".join(f"`{a[2:]}`" for a in suite.train_args()) + f". Seeds "
        f"{', '.join(map(str, d.seeds))}; the fixed init or data order is seed {d.fixed_seed}'s.",
        "",
        "## The spread of the final validation loss",
        "",
        "| recipe | lr | warmup | what varies with the seed | runs | mean | sd |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"both": "init and data order", "init": "init only", "data": "data order only"}
    for r in spread:
        mean = "-" if r["mean"] is None else f"{r['mean']:.4f}"
        sd = "-" if r["sd"] is None else f"{r['sd']:.4f}"
        lines.append(
            f"| `{r['recipe']}` | {_lr(r['lr'])} | {r['warmup']:g} | {names[r['varies']]} | {r['n']} | {mean} | {sd} |"
        )
    lines += [
        "",
        "## Pairing by seed",
        "",
        f"Each recipe minus `{suite.reference}`, over the seeds both have: the sd of the paired differences "
        "against the sd of an unpaired difference (the two recipes' variances added), the 95% interval's "
        "half-width each way, and the share of the variance the pair has in common (1 - paired / unpaired "
        "variance: their correlation where the two spreads are equal).",
        "",
        "| recipe | what varies | seeds | mean difference | sd paired | sd unpaired | ± paired | ± unpaired | shared |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in pairing:
        corr = "-" if r["shared"] is None else f"{r['shared']:.2f}"
        lines.append(
            f"| `{r['recipe']}` | {names[r['varies']]} | {r['n']} | {r['mean_difference']:+.4f} | "
            f"{r['sd_paired']:.4f} | {r['sd_unpaired']:.4f} | {r['half_width_paired']:.4f} | "
            f"{r['half_width_unpaired']:.4f} | {corr} |"
        )
    failed = [f"`{r}`: " + "; ".join(report.failures(r)) for r in suite.recipes if report.failures(r)]
    lines += ["", "Runs that did not learn (left out above): " + (" ".join(failed) if failed else "none.")]
    return "\n".join(lines) + "\n"


def write_tables(out_dir: Path, name: str, markdown: str, tables: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """``<name>.md`` and one CSV per table, each written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_dir / f"{name}.md", "w") as f:
        f.write(markdown)
    written = [out_dir / f"{name}.md"]
    for stem, rows in tables.items():
        write_csv_atomic(out_dir / f"{stem}.csv", [interval_columns(r) for r in rows])
        written.append(out_dir / f"{stem}.csv")
    return written


def write_tuned(report: TunedReport, rows: list[dict], provenance: TableProvenance, partial: bool, out_dir: Path):
    """A tuned suite's files: ``<name>.md``, table.csv (its rows), runs.csv (every run), pairs.csv (every pair of
    rows' paired difference), balance.csv where runs log per-block metrics, gradients.csv where they log the global
    gradient norm, gain.csv where they log the stream-mix gain, and the figures."""
    markdown = tuned_markdown(report, rows, provenance, partial)
    pairs = report.pair_rows([r["recipe"] for r in rows if r.get("val_loss")])
    tables = {"table": rows, "runs": report.grid_rows(), "pairs": pairs}
    if balance := balance_rows(report):
        tables["balance"] = balance
    if gradients := gradient_rows(report):
        tables["gradients"] = gradients
    if gains := gain_rows(report):
        tables["gain"] = gains
    written = write_tables(out_dir, report.suite.name, markdown, tables)
    figures = (
        plot_lr_panels(report, rows, out_dir),
        plot_paired_differences(report, rows, out_dir),
        plot_gain(report, out_dir),
    )
    return written + [p for p in figures if p]


def write_pilot(report: PilotReport, provenance: TableProvenance, partial: bool, out_dir: Path) -> list[Path]:
    """The seed pilot's files: ``<name>.md``, spread.csv, pairing.csv and the spread figure."""
    markdown = pilot_markdown(report, provenance, partial)
    tables = {"spread": report.spread_rows(), "pairing": report.pairing_rows()}
    return [*write_tables(out_dir, report.suite.name, markdown, tables), plot_seed_spread(report, out_dir)]


# ---------------------------------------------------------------------------------------------------------------------
# A suite's figures: each recipe's LR sensitivity in a panel of its own, with the pick's interval; the paired
# differences from the reference as a forest plot; the seed pilot's spread by what varies.


def plot_lr_panels(report: TunedReport, rows: list[dict], out_dir: Path) -> Path:
    """One panel per recipe: validation loss at the selection seed against the peak LR, a line per warmup; the
    pick's fresh-seed mean with its 95% interval; the unigram loss dashed."""
    recipes = report.suite.recipes
    fig, axes = panels(len(recipes), ncols=min(4, len(recipes)), width=3.2, height=2.6, sharey=True)
    by_recipe = {r["recipe"]: r for r in rows}
    top = report.unigram + 0.25
    finite = [v for sel in report.selections.values() for v in sel.scores.values() if math.isfinite(v)]
    bottom = min(finite, default=report.unigram - 1.5) - 0.1
    for ax, recipe in zip(axes, recipes):
        sel = report.selections[recipe]
        ax.set_title(recipe, fontsize=9)
        lrs = [*report.design.lrs_of(recipe), *(s.lr for s in sel.extensions)]
        ax.set_xscale("log")
        ax.set_xlim(min(lrs) / 1.4, max(lrs) * 1.4)  # the budget's LRs, whatever has run so far
        ax.tick_params(labelsize=7)
        if not sel.scores:  # a suite under way: this recipe's grid has not begun
            ax.text(0.5, 0.5, "no runs yet", transform=ax.transAxes, ha="center", fontsize=8, color="gray")
            continue
        for warmup, style in zip(report.design.warmups, ("o-", "s--", "^:", "d-.")):
            points = sorted((s.lr, v) for s, v in sel.scores.items() if s.warmup == warmup)
            xs = [lr for lr, _ in points]
            ys = [min(v, top) if math.isfinite(v) else top for _, v in points]  # diverged: drawn at the top
            ax.plot(xs, ys, style, ms=3, lw=1, label=f"warmup {warmup:g}")
        row = by_recipe.get(recipe, {})
        if row.get("val_loss") is not None:
            ci = row["val_loss"]
            ax.errorbar(
                [row["lr"]],
                [ci.mean],
                yerr=[[ci.half_width or 0], [ci.half_width or 0]],
                fmt="*",
                color="black",
                ms=8,
                capsize=3,
                label=f"pick, {ci.n} fresh seeds",
            )
        ax.axhline(report.unigram, ls="--", lw=0.8, color="gray")
        ax.set_ylim(bottom, top + 0.05)
    axes[0].set_ylabel("val loss (nats)")
    fig.suptitle("LR sensitivity: selection seed (lines), pick over fresh seeds (star, 95% interval)", fontsize=9)
    return save_figure(fig, axes, axes[:1], out_dir / "lr_panels.png")


def plot_paired_differences(report: TunedReport, rows: list[dict], out_dir: Path) -> Path | None:
    """Each recipe minus the reference, paired by seed, with its 95% interval: validation and test."""
    shown = [r for r in rows if r.get("delta_val") is not None]
    if not shown:
        return None
    series = [("delta_val", "validation", "o"), ("delta_test", "test", "s")]
    xlabel = f"loss minus {report.suite.reference}'s, paired by seed (nats; 95% interval)"
    return forest_plot(shown, series, xlabel, out_dir / "paired_differences.png")


def plot_seed_spread(report: PilotReport, out_dir: Path) -> Path:
    """Each recipe's final validation losses, one column per source of variation."""
    recipes = report.suite.recipes
    fig, axes = panels(len(recipes), ncols=len(recipes), width=3.4, height=3.0)
    names = {"both": "init + data", "init": "init only", "data": "data only"}
    for ax, recipe in zip(axes, recipes):
        for x, group in enumerate(report.design.GROUPS):
            values = list(report.values(recipe, group).values())
            ax.plot([x] * len(values), values, "o", ms=4, alpha=0.7)
        ax.set_xticks(range(3), [names[g] for g in report.design.GROUPS], fontsize=8)
        ax.set_title(recipe, fontsize=9)
        ax.set_ylabel("final val loss (nats)")
    return save_figure(fig, axes, [], out_dir / "seed_spread.png")
