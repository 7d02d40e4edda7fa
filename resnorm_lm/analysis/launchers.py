"""How a sweep's runs are trained here (``--launcher local``), each a ``resnorm-lm fit`` subprocess; SLURM jobs
(``--launcher slurm``) are ``slurm_launcher.py``'s.

Training a sweep's runs on this machine: each a ``resnorm-lm fit`` subprocess, ``jobs`` at a time (one GPU each
where there are enough, one log file each), the data they resolve to prepared once before parallel jobs start, a
stop passed on to the runs in training, and the time it will take. A probe's few runs (``scripts/``) train through
``train_probe_runs``: skipped when finished, resumed when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import yaml

from resnorm_lm.analysis.sweep import RunSpec, estimate_seconds
from resnorm_lm.train.preemption import LAUNCHER_GONE
from resnorm_lm.train.recipes import recipe_depth
from resnorm_lm.train.runs import RunDir, working_root

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
COMPARE_PID = "RESNORM_LM_COMPARE_PID"  # set for each fit compare starts: compare's pid
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class RunningFits:
    """Runs fit commands, each in its own session, and passes a stop on to those running (see the module)."""

    def __init__(self, who: str) -> None:
        self.who = who  # the command whose fits these are, as its messages name it: compare or suite
        self.stop_signal: int | None = None  # the first stop signal received
        self.stops = 0  # how many stop signals came; each fit is sent as many SIGTERMs, at most
        self.sent: dict[subprocess.Popen, int] = {}  # each running fit and the SIGTERMs sent to it

    def run(self, cmd: list[str], **popen: object) -> int | None:
        """Run ``cmd`` to its end and return its exit code; None, without starting it, after a stop."""
        if self.stops:
            return None
        env = {**(popen.pop("env", None) or os.environ), COMPARE_PID: str(os.getpid())}
        process = subprocess.Popen(cmd, start_new_session=True, env=env, **popen)
        self.sent[process] = 0
        try:
            self._pass_stops_on(process)  # a stop that came while it started
            return process.wait()
        finally:
            del self.sent[process]

    @contextlib.contextmanager
    def stoppable(self) -> Iterator[None]:
        """While the fits of a sweep train: the stop signals pass on to them. After the block, if a stop came,
        say so and exit with 128 + its signal."""
        handled = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
        previous = {signum: signal.signal(signum, self._on_stop) for signum in handled}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self.stop_signal is not None:
            with contextlib.suppress(OSError):
                print(
                    f"{self.who}: stopped by {signal.Signals(self.stop_signal).name}; run the same command again "
                    "to resume it",
                    file=sys.stderr,
                    flush=True,
                )
            raise SystemExit(128 + self.stop_signal)

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stops += 1
        if self.stop_signal is None:
            self.stop_signal = signum
        name = signal.Signals(signum).name
        running = list(self.sent)
        if self.stops == 1:
            said = (
                f"\n{self.who}: {name}: {len(running)} run(s) in training save last.ckpt at the end of their step "
                f"and stop, and no run starts; {name} again stops them at once\n"
            )
        else:
            said = f"\n{self.who}: {name} again: the {len(running)} run(s) in training stop at once\n"
        with contextlib.suppress(OSError):  # a closed terminal's SIGHUP: nowhere to say it
            os.write(2, said.encode())  # not print: the signal may have come in the middle of one
        for process in running:
            self._pass_stops_on(process)

    def _pass_stops_on(self, process: subprocess.Popen) -> None:
        while self.sent.get(process, self.stops) < self.stops:
            self.sent[process] += 1
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.killpg(process.pid, signal.SIGTERM)


def stop_with_compare() -> None:
    """In a fit that compare started: have the kernel send this process ``LAUNCHER_GONE`` when compare dies, however
    it dies (Linux; elsewhere nothing), so that a ``kill -9`` of compare stops its fits as a ``kill`` does. The
    variable is taken out of the environment, so that processes this fit starts (its DDP ranks) are left alone."""
    compare_pid = os.environ.pop(COMPARE_PID, None)
    if compare_pid is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, LAUNCHER_GONE) != 0:
        return  # not allowed here (a sandbox): the fit trains on if compare dies, as it would elsewhere
    if os.getppid() != int(compare_pid):  # compare died before the request took hold
        os.kill(os.getpid(), LAUNCHER_GONE)


# ---------------------------------------------------------------------------------------------------------------------
# Training a sweep's runs: each a ``resnorm-lm fit`` subprocess, ``jobs`` at a time (one GPU each where there
# are enough, one log file each), the data prepared once before parallel jobs start, a stop passed on to the runs in
# training (``RunningFits``), and the time it will take (seconds per step measured on the finished runs of the
# profile, by number of blocks).


class SweepTrainer:
    """Trains run specs as subprocesses, ``jobs`` at a time (one GPU each where there are enough)."""

    who = "compare"  # the command, as its messages name it

    def __init__(self, profile: str, root: str, extra: list[str], jobs: int, group: str | None = None) -> None:
        self.profile, self.root, self.extra, self.jobs = profile, root, extra, max(1, jobs)
        self.group = group  # the runs' W&B group (``run.group``): the sweep's or the suite's name
        self.slots = list(range(self.jobs))
        self.lock = threading.Lock()
        gpus = torch.cuda.device_count()
        self.gpu_per_job = gpus >= self.jobs > 1
        self.prepared: set[str] = set()  # data settings prepared by prepare_data (as JSON)
        self.fits = RunningFits(self.who)

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
            f"{self.who}: {what}: {len(specs)} runs, {len(specs) - len(todo)} finished, {len(todo)} to train "
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
        group = [f"--run.group={self.group}"] if self.group else []
        return [f"--run.root={self.root}", f"--run.tag={spec.tag}", *group, *spec.overrides()]

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


def refit_command(config: Path, root: Path, tag: str, resume: bool) -> list[str]:
    """``fit`` of a committed run's own config, written under ``root`` with run tag ``tag``: a probe's way to train a
    suite's run again. A fresh run asks for no checkpoint (a config saved by a resumed segment names the one it
    resumed from)."""
    return [
        sys.executable,
        *("-m", "resnorm_lm", "fit", "--config", str(config)),
        f"--run.root={root}",
        f"--run.tag={tag}",
        "--trainer.enable_progress_bar=false",
        "--ckpt_path=last" if resume else "--ckpt_path=null",
    ]


def train_probe_runs(
    runs: list[tuple[Path, Callable[[bool], list[str]]]], env: dict[str, str], jobs: int, who: str
) -> int:
    """A probe's runs (each its directory and its ``fit`` command, given whether it resumes), ``jobs`` at a time
    in ``env``: each finished one skipped, each interrupted one resumed from its checkpoint, each logging to
    ``<its directory>.log``. 0 unless a fit failed (a divergence is a result, not a failure)."""
    todo = [(path, command) for path, command in runs if RunDir(path).state() != "finished"]
    print(f"{who}: {len(runs)} runs, {len(todo)} to train, {jobs} at a time", flush=True)

    def one(path: Path, command: Callable[[bool], list[str]]) -> int:
        print(f"{who}: training {path}", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.with_name(f"{path.name}.log").open("a") as log:
            # in this process group: a Ctrl-C reaches each fit, which saves last.ckpt and stops (train again resumes)
            code = subprocess.run(command(RunDir(path).has_checkpoint()), env=env, stdout=log, stderr=log).returncode
        print(f"{who}: {path}: exit {code}", flush=True)
        return code

    from resnorm_lm.train.lightning_cli import EXIT_DIVERGED  # here: lightning loads only when a probe trains

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        codes = list(pool.map(lambda run: one(*run), todo))
    return 0 if all(code in (0, EXIT_DIVERGED) for code in codes) else 1


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


# ---------------------------------------------------------------------------------------------------------------------
# The data settings a ``fit`` command resolves to, found without building the CLI.
#
# ``resnorm-lm fit --recipe R --profile P <overrides>`` reads its ``data`` group from the config files
# ``expand_recipe_arguments`` puts first (the profile, the recipe, its tuned overlay) and then from the
# command line, in order, later values winning. ``data_settings`` reads the same arguments the same way: the
# ``data`` section of each ``--config`` file and each ``--data...`` option, in command-line order, through the
# parser LightningCLI builds for its ``data`` group (``TextDataModule``'s signature: its types and defaults).
# What it returns is the ``data`` section ``--print_config`` prints (tests/test_sweep.py checks the two agree).

CONFIG_OPTIONS = ("--config", "-c")


def data_settings(recipe: str, profile: str, extra: list[str]) -> dict[str, Any] | None:
    """The ``data`` section that ``fit --recipe <recipe> --profile <profile> <extra>`` resolves to (None when
    its data arguments do not parse: each job then reports its own config error)."""
    from lightning.pytorch.cli import LightningArgumentParser

    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.train.recipes import expand_recipe_arguments

    args = expand_recipe_arguments(["fit", "--recipe", recipe, "--profile", profile, *extra], say=False)
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(TextDataModule, "data")
    try:
        settings = parser.parse_object({})  # TextDataModule's defaults
        for source in data_sources(args):
            if isinstance(source, dict):
                settings = parser.parse_object({"data": source}, settings)
            else:
                settings = parser.parse_args(source, namespace=settings)
    except (argparse.ArgumentError, OSError, yaml.YAMLError):
        return None
    return settings.data.as_dict()


def data_sources(args: list[str]) -> Iterator[dict[str, Any] | list[str]]:
    """What sets ``data``, in command-line order: each config file's ``data`` section (a dict), and each
    ``--data...`` option with its value (``["--data.KEY=VALUE"]``). Every such option takes one value, given
    after ``=`` or as the next argument."""
    i = 0
    while i < len(args):
        name, has_value, value = args[i].partition("=")
        if name in CONFIG_OPTIONS or name == "--data" or name.startswith("--data."):
            if not has_value and i + 1 < len(args):
                i, value = i + 1, args[i + 1]
            if name in CONFIG_OPTIONS:
                section = (yaml.safe_load(Path(value).read_text()) or {}).get("data")
                if isinstance(section, dict):
                    yield section
            else:
                yield [f"{name}={value}"]
        i += 1
