"""How a sweep's runs are trained: here, each a ``resnorm-lm fit`` subprocess (``--launcher local``), or as
SLURM jobs (``--launcher slurm``).

## Here

Training a sweep's runs on this machine: each a ``resnorm-lm fit`` subprocess, ``jobs`` at a time (one GPU each
where there are enough, one log file each), the data they resolve to prepared once before parallel jobs start, a
stop passed on to the runs in training, and the time it will take. A probe's few runs (``scripts/``) train through
``train_probe_runs``: skipped when finished, resumed when interrupted.

## SLURM

A sweep's runs as SLURM jobs (``compare --launcher slurm``): what each job asks SLURM for (the site's config file,
then ``--slurm-*``), submitting, following and resuming them, never two jobs for one run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from resnorm_lm.analysis.sweep import RunSpec, estimate_seconds
from resnorm_lm.errors import ResnormError
from resnorm_lm.train.preemption import LAUNCHER_GONE
from resnorm_lm.train.recipes import recipe_depth
from resnorm_lm.train.runs import REPO_ROOT, RunDir, working_root

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


CONFIG_ENV = "RESNORM_LM_SLURM_CONFIG"
# sbatch --time's formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]
TIME_FORMAT = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|UNLIMITED|INFINITE)$")


@dataclass(frozen=True)
class SlurmOptions:
    """A sweep's SLURM settings: what each run's job asks for, and how many jobs compare keeps in the queue."""

    partition: str | None = None  # --partition; None: the cluster's default partition
    account: str | None = None  # --account, where the site bills by account
    time: str | None = None  # --time of each job, e.g. "04:00:00" or "1-00:00:00"; None: the partition's default
    gpus_per_run: int | None = None  # --gres=gpu:G, one task per GPU; None: 1 where the profile trains on a GPU
    cpus_per_run: int | None = None  # CPUs of one run, shared by its tasks (--cpus-per-task); None: SLURM's default
    max_jobs: int = 100  # the most of the sweep's jobs queued or running at once
    poll_seconds: float = 30.0  # how often compare asks squeue while it waits
    sbatch_args: tuple[str, ...] = ()  # further sbatch options, as the site needs them

    def __post_init__(self) -> None:
        for name in ("partition", "account", "time"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"slurm {name} must be a non-empty string, got {value!r}")
        if self.time is not None and not TIME_FORMAT.match(self.time):
            raise ValueError(
                f"slurm time {self.time!r} is none of sbatch's formats: minutes, hours:minutes:seconds, "
                "days-hours:minutes:seconds (e.g. 04:00:00, 1-00:00:00)"
            )
        for name, minimum in (("gpus_per_run", 0), ("cpus_per_run", 1), ("max_jobs", 1)):
            value = getattr(self, name)
            optional = name != "max_jobs"
            if (value is None and optional) or (type(value) is int and value >= minimum):
                continue
            raise ValueError(f"slurm {name} must be an integer >= {minimum}, got {value!r}")
        if (
            isinstance(self.poll_seconds, bool)
            or not isinstance(self.poll_seconds, int | float)
            or not self.poll_seconds > 0
        ):
            raise ValueError(f"slurm poll_seconds must be a number > 0, got {self.poll_seconds!r}")
        if not all(isinstance(arg, str) and arg.startswith("-") for arg in self.sbatch_args):
            raise ValueError(
                f"slurm sbatch_args must be sbatch options such as '--qos=normal', got {list(self.sbatch_args)!r}"
            )

    @classmethod
    def load(cls, path: str | None = None, **given: Any) -> SlurmOptions:
        """The config file's settings (``path``, else ``config_path()``), then the ``given`` ones that are not
        None (compare's command line)."""
        file = Path(path) if path else config_path()
        settings = read_config(file) if file is not None else {}
        settings.update({name: value for name, value in given.items() if value is not None})
        return cls(**settings)

    def sbatch_options(self, gpus: int) -> list[str]:
        """sbatch's options for one run on ``gpus`` GPUs (0: the CPU), one task per GPU."""
        tasks = max(gpus, 1)
        options = [f"--ntasks-per-node={tasks}"] + ([f"--gres=gpu:{gpus}"] if gpus else [])
        if self.cpus_per_run is not None:
            options.append(f"--cpus-per-task={self.cpus_per_task(gpus)}")
        for name in ("partition", "account", "time"):
            if getattr(self, name) is not None:
                options.append(f"--{name}={getattr(self, name)}")
        return options + list(self.sbatch_args)

    def cpus_per_task(self, gpus: int) -> int | None:
        """The CPUs of each of a run's tasks (one per GPU): ``cpus_per_run`` shared out, at least 1."""
        return None if self.cpus_per_run is None else max(1, self.cpus_per_run // max(gpus, 1))


def config_path() -> Path | None:
    """Where the site's config is when ``--slurm-config`` names none: $RESNORM_LM_SLURM_CONFIG, else
    ~/.config/resnorm-lm/slurm.yaml where it exists, else none."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = home / "resnorm-lm" / "slurm.yaml"
    return path if path.is_file() else None


def read_config(path: Path) -> dict[str, Any]:
    """The settings of a config file (``yaml.safe_load``: a config is data); unknown keys fail with the valid ones."""
    import yaml

    if not path.is_file():
        raise ValueError(f"no SLURM config file at {path}")
    settings = yaml.safe_load(path.read_text()) or {}
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: a SLURM config is a mapping of settings, got {type(settings).__name__}")
    valid = [field.name for field in dataclasses.fields(SlurmOptions)]
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    if isinstance(settings.get("time"), int | float):  # YAML reads 4:00:00 as a number (of seconds, base 60)
        raise ValueError(f'{path}: write the time limit in quotes, e.g. time: "04:00:00", got {settings["time"]!r}')
    if isinstance(settings.get("sbatch_args"), list):
        settings["sbatch_args"] = tuple(settings["sbatch_args"])
    return settings


# ---------------------------------------------------------------------------------------------------------------------
# compare's SLURM launcher (``compare --launcher slurm``): each run of a sweep is one SLURM job of
# scripts/slurm/train.sbatch, which runs under ``srun`` the ``fit`` command the local launcher runs.
#
#     SlurmSweepTrainer  the launcher: the local one's plan and data preparation, then submits, waits, reports
#     SlurmQueue         SLURM's commands as the launcher uses them: sbatch, squeue, scontrol
#     QueuedJob          one line of squeue: a job, its state and the run it trains
#
# A job names its run in SLURM itself: its comment is the run directory (absolute), its name
# ``<recipe>/<run directory's name>``, its log <run dir>/slurm-<job id>.out (appended across requeues). Started
# again, compare asks squeue for the user's jobs and submits a run only when it is neither finished (eval.json)
# nor held by a job that is queued or running: never two jobs for one run, however compare or its jobs were
# interrupted. A job that ends with its run unfinished is reported with its log and the sweep goes on; this
# compare does not submit it again, the next one does (and it resumes from its last.ckpt).
#
# Why one sbatch per run rather than submitit or a job array: docs/cluster.md (Sweeps on SLURM).

TRAIN_SBATCH = REPO_ROOT / "scripts" / "slurm" / "train.sbatch"
# squeue's states of a job that has ended; any other state (PENDING, RUNNING, COMPLETING, REQUEUED,
# SUSPENDED, ...) still holds its run
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"})


class SlurmError(ResnormError, RuntimeError):
    """A SLURM command failed, or a sweep cannot be submitted as it is."""


@dataclass(frozen=True)
class QueuedJob:
    """A job as squeue lists it."""

    job_id: str
    state: str  # squeue's %T: PENDING, RUNNING, COMPLETED, FAILED, ...
    comment: str  # a sweep's job: the run directory it trains (absolute)

    @property
    def holds_its_run(self) -> bool:
        """Queued or running: its run must get no other job."""
        return self.state not in ENDED

    @property
    def waiting(self) -> bool:
        """Queued (a requeued job too), not yet running."""
        return self.state in WAITING


class SlurmQueue:
    """sbatch, squeue and scontrol as the launcher calls them; ``run`` (``subprocess.run``'s signature) stands in
    for them in tests."""

    def __init__(self, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> None:
        self.run = run

    def call(self, argv: list[str], env: dict[str, str] | None = None) -> str:
        try:
            done = self.run(argv, capture_output=True, text=True, timeout=120, env=env)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SlurmError(f"{argv[0]}: {err}") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout or "").strip() or f"exit code {done.returncode}"
            raise SlurmError(f"{argv[0]} failed: {why}")
        return done.stdout

    def jobs(self) -> list[QueuedJob]:
        """This user's jobs that SLURM knows: queued, running, and ended within its MinJobAge (minutes)."""
        out = self.call(["squeue", "--noheader", "--states=all", f"--user={os.getuid()}", "--format=%i %T %k"])
        jobs = []
        for line in out.splitlines():
            job_id, state, comment = (line.strip().split(" ", 2) + [""])[:3]
            if job_id and state:
                jobs.append(QueuedJob(job_id, state, comment))
        return jobs

    def submit(self, options: list[str], script: Path, env: dict[str, str]) -> str:
        """``sbatch`` the script with ``options`` and the job's environment ``env``; its job id."""
        return self.call(["sbatch", "--parsable", *options, str(script)], env).strip().split(";")[0]  # id[;cluster]

    def exit_code(self, job_id: str) -> str | None:
        """The job's exit code and signal ("2:0") while SLURM remembers it, else None."""
        try:
            out = self.call(["scontrol", "--oneliner", "show", "job", job_id])
        except SlurmError:
            return None
        found = re.search(r"\bExitCode=(\S+)", out)
        return found.group(1) if found else None


class SlurmSweepTrainer(SweepTrainer):
    """Trains run specs as SLURM jobs, at most ``options.max_jobs`` queued or running at once, and waits until
    each has ended: the local launcher's plan, data preparation and ``fit``, on the cluster."""

    def __init__(
        self,
        profile: str,
        root: str,
        extra: list[str],
        options: SlurmOptions,
        queue: SlurmQueue | None = None,
        sleep: Callable[[float], None] = time.sleep,
        group: str | None = None,
    ) -> None:
        super().__init__(profile, root, extra, jobs=options.max_jobs, group=group)
        self.options, self.queue, self.sleep = options, queue or SlurmQueue(), sleep
        accelerator = str(profile_trainer(profile).get("accelerator", "auto"))
        self.gpus = options.gpus_per_run if options.gpus_per_run is not None else int(accelerator != "cpu")
        self.failed: set[RunSpec] = set()  # runs whose job ended unfinished in this compare: not submitted again
        spaced = [arg for arg in [f"--run.root={root}", *extra] if any(c.isspace() for c in arg)]
        if spaced:  # train.sbatch passes the options as one variable, split into words
            raise SlurmError(f"a SLURM job's fit options cannot hold spaces: {spaced[0]!r}")
        if not TRAIN_SBATCH.is_file():
            raise SlurmError(f"no {TRAIN_SBATCH}: compare --launcher slurm runs from a clone of the repository")

    def job_run_dir(self, spec: RunSpec) -> Path:
        """The run directory as the job sees it (it runs in the repository root, as the local jobs do), absolute:
        the job's comment, which names its run to a later compare."""
        return Path(os.path.normpath(REPO_ROOT / spec.run_dir(self.root, self.profile)))

    def log_path(self, spec: RunSpec, job_id: str) -> Path:
        return self.job_run_dir(spec) / f"slurm-{job_id}.out"

    def train_all(self, specs: list[RunSpec]) -> None:
        if not specs:
            return
        held: dict[str, list[QueuedJob]] = {}  # run directory -> the jobs that hold it
        for job in self.queue.jobs():  # before anything is submitted: a failure here ends compare
            if job.holds_its_run:
                held.setdefault(job.comment, []).append(job)
        watched: dict[str, RunSpec] = {}  # job id -> its run
        to_submit = []
        for spec in specs:
            jobs = held.get(str(self.job_run_dir(spec)), [])
            watched.update({job.job_id: spec for job in jobs})
            if not jobs and spec not in self.failed:
                to_submit.append(spec)
        failed_before = [spec for spec in specs if spec in self.failed and spec not in watched.values()]
        ids = sorted(watched, key=lambda job_id: (len(job_id), job_id))
        held_by = f" (job {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''})" if ids else ""
        again = f", {len(failed_before)} failed earlier in this compare (not submitted again)" if failed_before else ""
        print(
            f"compare: SLURM: {len(specs)} runs to train: {len(watched)} already queued or running{held_by}, "
            f"{len(to_submit)} to submit{again}",
            flush=True,
        )
        if to_submit:
            self.prepare_data(to_submit)
        try:
            self.wait(watched, to_submit)
        except KeyboardInterrupt:  # Ctrl-C: compare stops, the jobs do not
            print(
                "\ncompare: stopped waiting; the SLURM jobs go on. Run the same command again to wait for them: it "
                "submits no run twice",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(130) from None

    def wait(self, watched: dict[str, RunSpec], to_submit: list[RunSpec]) -> None:
        """Poll squeue, report each job that has ended, submit while fewer than ``max_jobs`` are watched, until
        none is left; a line of progress whenever the counts change."""
        done = failed = 0
        said = ""
        polled: dict[str, QueuedJob] = {}  # job id -> the job at the last poll
        while watched or to_submit:
            try:
                polled = {job.job_id: job for job in self.queue.jobs()}
            except SlurmError as err:  # the controller busy or restarting: the jobs go on, ask again later
                print(f"compare: {err}; asking again in {self.options.poll_seconds:g} s", file=sys.stderr, flush=True)
            else:
                for job_id, spec in list(watched.items()):
                    job = polled.get(job_id)  # None: SLURM has forgotten it (ended long enough ago)
                    if job is None or not job.holds_its_run:
                        del watched[job_id]
                        if self.ended(job_id, spec, job):
                            done += 1
                        else:
                            failed += 1
            while to_submit and len(watched) < self.options.max_jobs:
                spec = to_submit.pop(0)
                job_id = self.submit(spec)
                if job_id is None:
                    failed += 1
                else:
                    watched[job_id] = spec
            queued = sum(job_id not in polled or polled[job_id].waiting for job_id in watched)  # just submitted: queued
            line = (
                f"compare: SLURM jobs: {len(to_submit)} to submit, {queued} queued, {len(watched) - queued} "
                f"running, {done} done, {failed} failed"
            )
            if line != said:
                print(line, flush=True)
                said = line
            if watched or to_submit:
                self.sleep(self.options.poll_seconds)

    def submit(self, spec: RunSpec) -> str | None:
        """sbatch the run's job; its id, or None (said why) when SLURM refused it."""
        resume = RunDir(spec.run_dir(self.root, self.profile)).state() == "unfinished"
        run_dir = self.job_run_dir(spec)
        run_dir.mkdir(parents=True, exist_ok=True)  # SLURM opens the job's log there
        options = [
            f"--job-name={spec.recipe}/{run_dir.name}",
            f"--comment={run_dir}",
            f"--output={run_dir / 'slurm-%j.out'}",
            f"--chdir={REPO_ROOT}",
            "--export=ALL",
            *self.options.sbatch_options(self.gpus),
        ]
        try:
            job_id = self.queue.submit(options, TRAIN_SBATCH, self.job_environment(spec, resume))
        except SlurmError as err:
            self.failed.add(spec)
            print(f"compare: could not submit {self.label(spec)}: {err}", file=sys.stderr, flush=True)
            return None
        print(
            f"compare: {'resuming' if resume else 'training'} {self.label(spec)}: SLURM job {job_id} "
            f"(log: {self.log_path(spec, job_id)})",
            flush=True,
        )
        return job_id

    def job_environment(self, spec: RunSpec, resume: bool) -> dict[str, str]:
        """train.sbatch's variables for the run (the fit command the local launcher runs), in this environment
        less the SLURM_ variables of any job compare itself runs in (they would mislead srun in the new job)."""
        env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
        if "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        env.update(
            RECIPE=spec.recipe,
            PROFILE=self.profile,
            SEED=str(spec.seed),
            RESUME="last" if resume else "",
            ARGS=" ".join([*self.run_options(spec), *self.extra]),
            PYTHON=sys.executable,
        )
        threads = self.options.cpus_per_task(self.gpus)
        if threads is not None:  # torch would otherwise use every core of the node
            env["OMP_NUM_THREADS"] = str(threads)
        return env

    def ended(self, job_id: str, spec: RunSpec, job: QueuedJob | None) -> bool:
        """Report a job that has ended: True when its run finished, else False (said how, and where its log is)."""
        if RunDir(spec.run_dir(self.root, self.profile)).state() == "finished":
            print(f"compare: finished {self.label(spec)} (SLURM job {job_id})", flush=True)
            return True
        self.failed.add(spec)
        code = self.queue.exit_code(job_id)
        how = f"{job.state if job else 'ended'}{f', exit code {code}' if code else ''}"
        log = self.log_path(spec, job_id)
        print(
            f"compare: FAILED {self.label(spec)}: SLURM job {job_id} {how}, its run unfinished; log: {log}\n"
            + "\n".join(f"    {line}" for line in last_lines(log)),
            file=sys.stderr,
            flush=True,
        )
        return False


def last_lines(log: Path, count: int = 3) -> list[str]:
    """The last ``count`` lines of a job's log that are not empty (from its last 8 KiB)."""
    if not log.is_file():
        return ["(no log: the job never started)"]
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - 8192))
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if line.strip()][-count:]
