"""A sweep's runs as SLURM jobs (``compare --launcher slurm``): what each job asks SLURM for (the site's config
file, then ``--slurm-*``), submitting, following and resuming them, never two jobs for one run. The jobs run
``scripts/slurm/train.sbatch``; the sweep's bookkeeping (plan, stop, time) is ``launchers.py``'s ``SweepTrainer``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resnorm_lm.analysis.launchers import SweepTrainer, profile_trainer
from resnorm_lm.analysis.sweep import RunSpec
from resnorm_lm.errors import ResnormError
from resnorm_lm.train.runs import REPO_ROOT, RunDir

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
