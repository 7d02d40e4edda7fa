"""Training a suite (``suite.py``'s ``resnorm-lm suite``): its design's plan, ``jobs`` runs at a time, each in the
suite's arithmetic, until nothing is left; then the test split of the runs a table reports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

from resnorm_lm.analysis.launchers import SweepTrainer
from resnorm_lm.analysis.sweep import RunOutcome, RunSpec, evaluated
from resnorm_lm.train.runs import RunDir, working_root

if TYPE_CHECKING:
    from resnorm_lm.analysis.suite import Design, Suite

# Training a suite: the design's plan, ``jobs`` runs at a time, each in the suite's arithmetic, until nothing is left.
#
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
    suite: Suite, design: Design, root: str, jobs: int, logger: str = "csv", machine: list[str] | None = None
) -> set[RunSpec]:
    """Train every run the plan wants until none is left; the runs that failed (and were not retried)."""
    trainer = SuiteTrainer(suite, root, jobs, logger, machine)
    failed: set[RunSpec] = set()
    running: dict[Future, RunSpec] = {}
    progress = Progress(suite, design)

    def next_runs() -> list[RunSpec]:
        plan, outcomes = settle(design, root, suite.profile)
        busy = set(running.values())
        todo = [s for s in plan if s not in outcomes and s not in busy and s not in failed]
        progress.say(len(outcomes), len(running), len(todo))
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
    """One line whenever the counts change: finished, in training, wanted now, and at most how many more."""

    def __init__(self, suite: Suite, design: Design) -> None:
        self.suite, self.most = suite, design.max_runs * len(suite.recipes)
        self.said = ""

    def say(self, finished: int, training: int, wanted: int) -> None:
        line = (
            f"suite {self.suite.name}: {finished} runs finished, {training} training, {wanted} more wanted now "
            f"(at most {self.most} in all)"
        )
        if line != self.said:
            print(line, flush=True)
            self.said = line


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
