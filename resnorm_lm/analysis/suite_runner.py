"""Training a suite (``suite.py``'s ``resnorm-lm suite``): its design's plan, ``jobs`` runs at a time, each in the
suite's arithmetic, until nothing is left; then the test split of the runs a table reports."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

from resnorm_lm.analysis.launchers import SweepTrainer
from resnorm_lm.analysis.sweep import RunOutcome, RunSpec, evaluated
from resnorm_lm.train.runs import RunDir, copy_small_files, working_root

if TYPE_CHECKING:
    from resnorm_lm.analysis.suite import Suite
    from resnorm_lm.analysis.suite_designs import Design

# As soon as a lane is free the next run of the plan starts (asked for again after every finished run, so a
# recipe's extensions and seeds start while other recipes' grids train); a run that fails is not started again in
# the same invocation (the next one resumes it); a stop (Ctrl-C, SIGTERM) reaches the runs in training, which save
# at the end of their step, and the same command resumes the suite (``launchers.py``). The test split is
# evaluated, in the suite's arithmetic, only on the runs whose numbers a table reports.


class SuiteTrainer(SweepTrainer):
    """compare's trainer with the suite's arithmetic and without tuned overlays (the suite states its settings)."""

    who = "suite"

    def __init__(self, suite: Suite, root: str, jobs: int, logger: str = "csv", machine: list | None = None) -> None:
        logging = [] if logger == "csv" else [f"--run.logger={logger}"]
        extra = [*suite.train_args(), *logging, *(machine or [])]  # machine: machine_overrides's, checked
        super().__init__(suite.profile, root, extra, jobs, group=f"suite-{suite.name}")
        self.suite = suite

    def command(self, spec: RunSpec, resume: bool) -> list[str]:
        cmd = super().command(spec, resume)
        at = cmd.index("--profile") + 2
        return [*cmd[:at], "--tuned", "none", *cmd[at:], "--run.sample_tokens=0"]

    def environment(self, slot: int) -> dict[str, str]:
        return self.suite.environment(super().environment(slot))


def outcome_of(spec: RunSpec, run_dir: Path) -> RunOutcome | None:
    """A finished run's outcome, from its own end-of-training validation (in the arithmetic it trained with);
    None while it is not finished."""
    summary = RunDir(run_dir).summary()
    if not summary.get("finished"):
        return None
    loss = summary.get("val_loss")
    diverged = bool(summary.get("diverged")) or loss is None
    return RunOutcome(spec, None if diverged else float(loss), diverged)


def settle(design: Design, root: str, profile: str) -> tuple[list[RunSpec], dict[RunSpec, RunOutcome]]:
    """The plan and the outcomes of its finished runs, asked again until the plan no longer grows (a finished run
    can decide the next, which may be finished already)."""
    outcomes: dict[RunSpec, RunOutcome] = {}
    while True:
        plan = design.plan(outcomes)
        new = {s: o for s in plan if s not in outcomes and (o := outcome_of(s, s.run_dir(root, profile)))}
        if not new:
            return plan, outcomes
        outcomes.update(new)


def train_suite(
    suite: Suite,
    design: Design,
    root: str,
    jobs: int,
    logger: str = "csv",
    machine: list[str] | None = None,
    export: str | None = None,
) -> set[RunSpec]:
    """Train every run the plan wants until none is left; the runs that failed (and were not retried). With
    ``export``, each finished run's small files are copied there as it finishes (and again once its test split is
    in): a suite that spans sessions loses at most its runs in flight with its machine."""
    trainer = SuiteTrainer(suite, root, jobs, logger, machine)
    failed: set[RunSpec] = set()
    running: dict[Future, RunSpec] = {}
    progress = Progress(suite, design, root, trainer.jobs)

    def next_runs() -> list[RunSpec]:
        plan, outcomes = settle(design, root, suite.profile)
        if not trainer.fits.stops:  # the test split while the checkpoints are there (a GPU machine's go with it)
            test_while_there(suite, [s.run_dir(root, suite.profile) for s in design.tested(outcomes)])
        if export:
            export_finished(suite, [s.run_dir(root, suite.profile) for s in outcomes], root, export)
        busy = set(running.values())
        todo = [s for s in plan if s not in outcomes and s not in busy and s not in failed]
        progress.say(outcomes, list(busy), todo)
        return todo

    def ended(spec: RunSpec, code: int | None) -> None:
        if code is not None and outcome_of(spec, spec.run_dir(root, suite.profile)) is None:
            failed.add(spec)  # crashed or refused: its log says why; the next invocation tries again

    with trainer.fits.stoppable():
        todo = next_runs()
        if todo:
            trainer.prepare_data(todo[:1])
        if trainer.jobs == 1:  # in this thread, as compare does (a fit's signal handlers need the main thread)
            while todo and not trainer.fits.stops:
                ended(todo[0], trainer.train(todo[0], slot=0))
                todo = next_runs()
            return failed
        with ThreadPoolExecutor(trainer.jobs) as pool:
            while True:
                while todo and len(running) < trainer.jobs and not trainer.fits.stops:
                    spec = todo.pop(0)
                    running[pool.submit(trainer._train_in_a_slot, spec)] = spec
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    ended(running.pop(future), future.result())
                todo = next_runs()
    return failed


class Progress:
    """One line whenever the counts change: finished, in training, wanted now, at most how many more, and how long
    they would take at this machine's pace (each recipe's median seconds of its finished full-length runs here)."""

    def __init__(self, suite: Suite, design: Design, root: str, jobs: int) -> None:
        self.suite, self.design, self.root, self.jobs = suite, design, root, max(1, jobs)
        self.most = design.max_runs * len(suite.recipes)
        self.said = ""

    def say(self, outcomes: dict[RunSpec, RunOutcome], training: list[RunSpec], todo: list[RunSpec]) -> None:
        counts = (
            f"suite {self.suite.name}: {len(outcomes)} runs finished, {len(training)} training, {len(todo)} more "
            f"wanted now (at most {self.most} in all)"
        )
        if counts != self.said:
            print(counts + self.time_left(outcomes, [*training, *todo]), flush=True)
            self.said = counts

    def time_left(self, outcomes: dict[RunSpec, RunOutcome], wanted: list[RunSpec]) -> str:
        """'; about 3.5 h for those, at most 7.9 h (...)', or '' before any full-length run has finished. A run in
        training counts in full; a recipe with no finished run counts at the median of the others, and is named: a
        design's step can cost several times another's (AttnRes's at 24 blocks 3.7x pre-norm's on a CPU)."""
        seconds = run_seconds(self.root, self.suite, outcomes)
        if not seconds:
            return ""
        typical = statistics.median(statistics.median(v) for v in seconds.values())
        pace = {recipe: statistics.median(v) for recipe, v in seconds.items()}
        now = sum(pace.get(spec.recipe, typical) for spec in wanted) / self.jobs
        done = Counter(spec.recipe for spec in outcomes)
        left = [(r, max(0, self.design.max_runs - done[r])) for r in self.suite.recipes]
        most = sum(n * pace.get(r, typical) for r, n in left) / self.jobs
        timed = sum(map(len, seconds.values()))
        untimed = [r for r, n in left if n and r not in pace]
        guessed = f"; {', '.join(untimed)} not timed yet, counted at the others' median" if untimed else ""
        return (
            f"; at this machine's pace about {duration(now)} for those, at most {duration(most)} ({self.jobs} at a "
            f"time; each recipe's median time a run, over {timed} finished full-length runs{guessed})"
        )


def run_seconds(root: str, suite: Suite, outcomes: dict[RunSpec, RunOutcome]) -> dict[str, list[float]]:
    """{recipe: the training seconds of each of its finished runs that trained every step} (a run that diverged
    early would understate the pace)."""
    out: dict[str, list[float]] = {}
    for spec in outcomes:
        summary = RunDir(spec.run_dir(root, suite.profile)).summary()
        full = suite.max_steps is None or summary.get("step") == suite.max_steps
        if full and summary.get("wall_s"):
            out.setdefault(spec.recipe, []).append(float(summary["wall_s"]))
    return out


def duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def export_finished(suite: Suite, run_dirs: list[Path], root: str, export: str) -> None:
    """The small files of ``run_dirs`` copied to ``export`` where they changed (``copy_small_files``)."""
    copied = copy_small_files(run_dirs, Path(root), Path(export))
    if copied:
        print(f"suite {suite.name}: exported the small files of {copied} run(s) to {export}", flush=True)


def test_while_there(suite: Suite, run_dirs: list[Path]) -> None:
    """``evaluate_test`` during training: a failure is said and left to the table's render, which tries again."""
    try:
        evaluate_test(suite, run_dirs)
    except RuntimeError as err:
        print(f"suite {suite.name}: {err}; the table's render tries again", flush=True)


def evaluate_test(suite: Suite, run_dirs: list[Path]) -> None:
    """The test split on ``run_dirs`` (those not yet evaluated there), in a process of the suite's arithmetic."""
    todo = [d for d in run_dirs if evaluated(d, "test") is None and RunDir(d).has_checkpoint()]
    if not todo:
        return
    env = suite.environment(os.environ)
    started = time.time()
    print(f"suite {suite.name}: evaluating the test split of {len(todo)} run(s) at their picks", flush=True)
    cmd = [sys.executable, "-m", "resnorm_lm", "eval", *map(str, todo), "--split", "test"]
    done = subprocess.run(cmd, cwd=working_root(), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the test evaluation failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    print(f"suite {suite.name}: test split evaluated in {time.time() - started:.0f} s", flush=True)
