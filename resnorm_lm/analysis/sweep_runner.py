"""Training a sweep's runs: each a ``resnorm-lm fit`` subprocess, ``jobs`` at a time (one GPU each where there
are enough, one log file each), the data prepared once before parallel jobs start, a stop passed on to the runs in
training (running_fits.py), and the time it will take (seconds per step measured on the finished runs of the
profile, by number of blocks).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from resnorm_lm.analysis.data_settings import data_settings
from resnorm_lm.analysis.running_fits import RunningFits
from resnorm_lm.analysis.sweep import RunSpec, estimate_seconds
from resnorm_lm.train.recipes import recipe_depth
from resnorm_lm.train.runs import RunDir, working_root


class SweepTrainer:
    """Trains run specs as subprocesses, ``jobs`` at a time (one GPU each where there are enough)."""

    who = "compare"  # the command, as its messages name it

    def __init__(self, profile: str, root: str, extra: list[str], jobs: int) -> None:
        self.profile, self.root, self.extra, self.jobs = profile, root, extra, max(1, jobs)
        self.slots = list(range(self.jobs))
        self.lock = threading.Lock()
        gpus = torch.cuda.device_count()
        self.gpu_per_job = gpus >= self.jobs > 1
        self.prepared: set[str] = set()  # data settings prepared by prepare_data (as JSON)
        self.fits = RunningFits()

    def plan(self, specs: list[RunSpec], what: str, training: bool = True) -> list[RunSpec]:
        """Print how many runs there are to train and an estimate of the time; return those to train."""
        states = {spec: RunDir(spec.run_dir(self.root, self.profile)).state() for spec in specs}
        todo = [s for s in specs if states[s] != "finished"]
        rates = step_seconds_by_blocks(Path(self.root), self.profile)
        own = {recipe: recipe_depth(recipe, self.profile) for recipe in {spec.recipe for spec in todo}}
        blocks = [spec.depth or own[spec.recipe] for spec in todo]
        max_steps = profile_max_steps(self.profile)
        eta = estimate_seconds([step_seconds_at(n, rates)[0] for n in blocks], max_steps, self.jobs)
        when = (
            f"about {eta / 60:.0f} min (s/step measured over {sum(map(len, rates.values()))} finished runs of this "
            f"profile: {timing_line(sorted(set(blocks)), rates)}; {max_steps} steps a run, {self.jobs} at a time)"
            if eta
            else "time unknown until a run of this profile has finished"
        )
        if not training:
            when = "not training them (--no-train)"
        resume = sum(states[s] == "unfinished" for s in todo)
        print(
            f"compare: {what}: {len(specs)} runs, {len(specs) - len(todo)} finished, {len(todo)} to train "
            f"({resume} to resume); {when if todo else 'nothing to train'}",
            flush=True,
        )
        return todo

    def train_all(self, specs: list[RunSpec]) -> None:
        """Train ``specs``; a stop signal meanwhile stops them at their next step and then compare (RunningFits)."""
        if self.jobs > 1:
            self.prepare_data(specs)
        with self.fits.stoppable():
            if self.jobs == 1:
                for spec in specs:
                    self.train(spec, slot=0)
                return
            with ThreadPoolExecutor(self.jobs) as pool:
                list(pool.map(self._train_in_a_slot, specs))

    def prepare_data(self, specs: list[RunSpec]) -> None:
        """Prepare the data of ``specs`` here, once, before parallel jobs start: on a cold cache they would
        otherwise all build the same corpus at once (safe, but each would wait for or repeat the work)."""
        from resnorm_lm.data.datamodule import TextDataModule
        from resnorm_lm.data.errors import DataError

        wanted = {}  # a setting's JSON -> the data settings; recipes of one profile usually share one
        for recipe in dict.fromkeys(spec.recipe for spec in specs):
            data = data_settings(recipe, self.profile, self.extra)
            if data is not None:  # a config error: each job reports it in its log
                wanted.setdefault(json.dumps(data, sort_keys=True), data)
        todo = [data for key, data in wanted.items() if key not in self.prepared]
        if not todo:
            return
        print(f"{self.who}: preparing the data before the {self.jobs} parallel jobs start", flush=True)
        with contextlib.chdir(working_root()):  # where the jobs run: relative data.files and cache_dir mean the same
            for data in todo:
                try:
                    TextDataModule(**data).prepare_data()
                except (DataError, ValueError) as err:
                    raise SystemExit(f"resnorm-lm {self.who}: error: preparing the data: {err}") from None
        self.prepared.update(json.dumps(data, sort_keys=True) for data in todo)

    def _train_in_a_slot(self, spec: RunSpec) -> int:
        with self.lock:
            slot = self.slots.pop()
        try:
            return self.train(spec, slot)
        finally:
            with self.lock:
                self.slots.append(slot)

    def run_options(self, spec: RunSpec) -> list[str]:
        """The ``fit`` options, after the recipe, profile and seed, that make ``spec``'s run: where it lives, its
        depth and setting (every launcher runs the same ``fit``)."""
        return [f"--run.root={self.root}", f"--run.tag={spec.tag}", *spec.overrides()]

    def label(self, spec: RunSpec) -> str:
        """'prenorm-12l (smoke, 6 layers, lr 0.001, warmup 0.3, seed 1)': a run as compare's messages name it."""
        depth = "" if spec.depth is None else f", {spec.depth} layers"
        fixed = "" if spec.init_seed is None else f", init of seed {spec.init_seed}"
        fixed += "" if spec.data_seed is None else f", data order of seed {spec.data_seed}"
        return f"{spec.recipe} ({self.profile}{depth}, {spec.setting.describe()}, seed {spec.seed}{fixed})"

    def command(self, spec: RunSpec, resume: bool) -> list[str]:
        """The ``fit`` command that trains (or resumes) ``spec``'s run."""
        return [
            sys.executable,
            "-m",
            "resnorm_lm",
            "fit",
            "--recipe",
            spec.recipe,
            "--profile",
            self.profile,
            f"--seed_everything={spec.seed}",
            *self.run_options(spec),
            *(["--ckpt_path=last"] if resume else []),
            *self.extra,
        ]

    def environment(self, slot: int) -> dict[str, str]:
        """The fit's environment: one GPU each where there are enough, else a share of the cores."""
        env = dict(os.environ)
        if self.jobs > 1:
            if self.gpu_per_job:
                env["CUDA_VISIBLE_DEVICES"] = str(slot)
            else:
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.jobs))
        return env

    def train(self, spec: RunSpec, slot: int) -> int | None:
        """Train ``spec``'s run and return the fit's exit code; None when compare is stopping (nothing started)."""
        if self.fits.stops:
            return None
        run_dir = spec.run_dir(self.root, self.profile)
        resume = RunDir(run_dir).state() == "unfinished"
        cmd = self.command(spec, resume)
        label = self.label(spec)
        print(f"\n{self.who}: {'resuming' if resume else 'training'} {label}", flush=True)
        env = self.environment(slot)
        out = None
        if self.jobs > 1:  # parallel runs: one log file each instead of interleaved progress bars
            run_dir.mkdir(parents=True, exist_ok=True)
            out = (run_dir / "train.log").open("a")
            cmd.append("--trainer.enable_progress_bar=false")
        try:
            code = self.fits.run(cmd, cwd=working_root(), env=env, stdout=out, stderr=out)
        finally:
            if out is not None:
                out.close()
        if code is None:
            return None
        if code != 0:
            print(f"{self.who}: {label} ended with exit code {code}", file=sys.stderr, flush=True)
        elif self.jobs > 1:
            print(f"{self.who}: finished {label} (log: {run_dir / 'train.log'})", flush=True)
        return code


def profile_trainer(profile: str) -> dict:
    """The ``trainer`` section of recipes/profiles/<profile>.yaml."""
    import yaml

    from resnorm_lm.train.recipes import RECIPES_DIR

    config = yaml.safe_load((RECIPES_DIR / "profiles" / f"{profile}.yaml").read_text())
    return config.get("trainer") or {}


def profile_max_steps(profile: str) -> int:
    return int(profile_trainer(profile).get("max_steps") or 0)


# ---------------------------------------------------------------------- time estimates


def step_seconds_by_blocks(root: Path, profile: str) -> dict[int, list[float]]:
    """Training seconds per step of the finished runs of ``profile`` under ``root``, by their number of blocks."""
    rates: dict[int, list[float]] = {}
    for path in root.glob(f"*/{profile}-*/eval.json"):
        run_dir = RunDir(path.parent)
        summary = run_dir.summary()
        if not (summary.get("finished") and summary.get("wall_s") and summary.get("step")):
            continue
        n_layer = run_dir.arch().get("n_layer")  # none without config.yaml: not timed
        if n_layer:
            rates.setdefault(int(n_layer), []).append(summary["wall_s"] / summary["step"])
    return rates


def step_seconds_at(n_layer: int, rates: dict[int, list[float]]) -> tuple[float | None, int | None]:
    """The median seconds per step of the timed runs of ``n_layer`` blocks, and that depth. Without any, those
    of the nearest depth timed, scaled in proportion to the blocks (which overstates the change: the embedding
    and head stay the same); (None, None) when no run has been timed."""
    if not rates:
        return None, None
    nearest = min(rates, key=lambda n: (abs(n - n_layer), n))
    return statistics.median(rates[nearest]) * n_layer / nearest, nearest


def timing_line(blocks: list[int], rates: dict[int, list[float]]) -> str:
    """'0.52 at 6 blocks, 3.48 at 48 blocks (scaled from 24)': the seconds per step an estimate used."""
    parts = []
    for n in blocks:
        seconds, timed = step_seconds_at(n, rates)
        parts.append(f"{seconds:.2f} at {n} blocks" + ("" if timed == n else f" (scaled from {timed})"))
    return ", ".join(parts)
