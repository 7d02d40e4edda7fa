"""Run directories: where a run lives (``RunDir``, the one reader of its files), the lock of the process that trains
it, what it records (manifest, eval.json), how it ends (the final validation and its RESULT line)."""

from __future__ import annotations

import csv
import errno
import fcntl
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.data.cache import atomic_write, write_json_atomic
from resnorm_lm.errors import ResnormError
from resnorm_lm.model.decoding import stream_text
from resnorm_lm.model.gpt import count_parameters
from resnorm_lm.train.checkpoint_io import CheckpointFileError, read_checkpoint_file
from resnorm_lm.train.diagnostics import DIAGNOSTICS_STEP, VAL_LOSS
from resnorm_lm.train.hardware import cpu_features, native_bf16_flags
from resnorm_lm.train.precision import PrecisionChoice

REPO_ROOT = Path(__file__).resolve().parents[2]  # the repository in a source checkout; site-packages in a wheel


def source_checkout() -> Path | None:
    """The repository this code runs from, or None when it runs from an installed wheel (no pyproject.toml
    beside the package: site-packages)."""
    return REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else None


def working_root() -> Path:
    """Where a sweep's jobs run, so that relative paths (run roots, data files, caches) mean the same in each:
    the repository in a source checkout, where make's commands run; else the current directory."""
    return source_checkout() or Path.cwd()


LOGGERS = ("csv", "wandb")
LEGACY_DATA_SEED = 1337  # the one data order of every run trained before data orders followed the run's seed


@dataclass
class RunConfig:
    """Where the run lives and how often it saves. Set by `make train`; rarely by hand."""

    recipe: str = "custom"  # recipe name: runs/<recipe>/...
    profile: str = "custom"  # profile name: runs/<recipe>/<profile>-seed<k>
    tag: str = ""  # a sweep setting such as lr1e-3-wu200: runs/<recipe>/<profile>-<tag>-seed<k>
    root: str = "runs"  # parent of all run directories
    checkpoint_every: int = 100  # save checkpoints/last.ckpt every N optimizer steps (and at the end)
    dist_timeout_s: int = 120  # collective-op timeout under DDP: a dead rank ends the job, not a hang
    sample_tokens: int = 0  # after training, print a sample of this many tokens (0: none)
    stop_after_steps: int | None = None  # stop at this step with the schedule of max_steps (split a run into jobs)
    base: str | None = None  # in a variant's recipe: the recipe it varies, whose tuned setting it takes if it has none
    tuned_overlay: str = ""  # set by --recipe: the tuned overlay applied (recipes/tuned/...), or none
    logger: str = "csv"  # csv: metrics.csv (and TensorBoard's files where it is installed); wandb: W&B beside them
    group: str | None = None  # the W&B group of the run (a sweep's or a suite's name: compare and suite set it)

    def __post_init__(self) -> None:
        for name, minimum in (("checkpoint_every", 1), ("dist_timeout_s", 1), ("sample_tokens", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"run.{name} must be an integer >= {minimum}, got {value!r}")
        if self.logger not in LOGGERS:
            raise ValueError(f"run.logger must be one of {', '.join(LOGGERS)}, got {self.logger!r}")
        if self.stop_after_steps is not None and not self.stop_after_steps >= 1:
            raise ValueError(f"run.stop_after_steps must be a step >= 1 (or null), got {self.stop_after_steps!r}")


def run_directory(
    run: RunConfig, seed: int | None, *, data_seed: int | None = None, init_seed: int | None = None
) -> Path:
    """``<root>/<recipe>/<profile>[-<tag>]-seed<k>``: seed k sets the init and the data order. A data order or
    an init fixed apart from the seed (``data.seed``, ``model.init_seed``) is named too (``-data<d>``,
    ``-init<i>``), so that runs that differ in either never share a directory; but for the data order 1337,
    which every run had before data orders followed the seed: those runs keep the names they were trained under
    (and the resume checks tell such a run from one of the seed's own data order)."""
    tag = f"-{run.tag}" if run.tag else ""
    name = f"{run.profile}{tag}-seed{seed if seed is not None else 'none'}"
    name += f"-init{init_seed}" if init_seed is not None and init_seed != seed else ""
    name += f"-data{data_seed}" if data_seed not in (None, seed, LEGACY_DATA_SEED) else ""
    return Path(run.root) / run.recipe / name


@dataclass(frozen=True)
class RunDir:
    """A run directory's files, and the one place that reads them::

        runs/<recipe>/<profile>[-<tag>]-seed<k>/
            config.yaml     the resolved config, as LightningCLI saved it
            manifest.json   code, versions, hardware, data, seed; a segment per start or resume; how it ended
            metrics.csv     the logged metrics (one row per logged step)
            eval.json       the summary finish_run writes, with the evaluations ``resnorm-lm eval`` merges in
            checkpoints/    last.ckpt (the latest state: the final weights once finished), best.ckpt, step*.ckpt
            .lock           held by the process training the run (resnorm_lm/train/runs.py)

    A file that is not there reads as empty ({}, or no checkpoints).
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.csv"

    @property
    def summary_path(self) -> Path:
        return self.path / "eval.json"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints_dir / "last.ckpt"

    def config(self) -> dict[str, Any]:
        """The configuration the run trained with (``yaml.safe_load``: a config is data)."""
        import yaml

        return (yaml.safe_load(self.config_path.read_text()) or {}) if self.config_path.is_file() else {}

    def manifest(self) -> dict[str, Any]:
        return json.loads(self.manifest_path.read_text()) if self.manifest_path.is_file() else {}

    def summary(self) -> dict[str, Any]:
        """eval.json: the run's RESULT values, how it ended, and its recorded evaluations (``eval``)."""
        return json.loads(self.summary_path.read_text()) if self.summary_path.is_file() else {}

    def metrics(self) -> list[dict[str, float]]:
        """metrics.csv rows as {column: float}, empty cells dropped."""
        if not self.metrics_path.is_file():
            return []
        with self.metrics_path.open(newline="") as f:
            return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]

    def small_files(self) -> list[Path]:
        """What a run keeps in git: its config, manifest, summary and metrics (never a checkpoint)."""
        names = (self.config_path, self.path / "hparams.yaml", self.manifest_path, self.summary_path, self.metrics_path)
        return [p for p in names if p.is_file()]

    def per_block(self, prefix: str) -> list[tuple[int, list[float]]]:
        """``(step, values)`` for every logged row of a per-block metric (``GRAD_NORMS``, ``STREAM_RMS`` of
        resnorm_lm/train/diagnostics.py), block 0 first (by index: right past 99 blocks). The step is the one the
        values were measured at (``DIAGNOSTICS_STEP``). Runs from before that was logged have only Lightning's
        logging row, ``log_every_n_steps - 1`` after the measurement (the rule since the first commit): that is
        taken off, so their first row is the initialization's, step 0, as in newer runs."""
        rows = self.metrics()
        later = 0 if any(DIAGNOSTICS_STEP in row for row in rows) else self.logging_row_delay()
        out = []
        for row in rows:
            columns = sorted((k for k in row if k.startswith(prefix)), key=lambda k: int(k[len(prefix) :]))
            if columns:
                out.append((int(row.get(DIAGNOSTICS_STEP, row.get("step", 0) - later)), [row[k] for k in columns]))
        return out

    def logging_row_delay(self) -> int:
        """How many steps after a diagnostic's measurement Lightning's logging row comes: ``log_every_n_steps - 1``
        of the run's config (0 without one, or where it logs every step)."""
        every = ((self.config().get("trainer") or {}).get("log_every_n_steps")) or 1
        return max(0, int(every) - 1)

    def checkpoints(self) -> list[Path]:
        return sorted(self.checkpoints_dir.glob("*.ckpt"))

    def has_checkpoint(self) -> bool:
        """Whether last.ckpt is there: a state to resume, or the final weights to evaluate."""
        return self.last_checkpoint.is_file()

    def state(self) -> str:
        """'finished' (eval.json from a completed fit), 'unfinished' (interrupted or preempted: a checkpoint to
        resume) or 'missing'.

        A finished run stays finished when its checkpoints were deleted to save disk (or left behind on the
        machine that trained it): its eval.json holds its results.
        """
        if self.summary().get("finished"):
            return "finished"
        return "unfinished" if self.has_checkpoint() else "missing"

    def arch(self) -> dict[str, Any]:
        """``model.arch`` of the run's config ({} without config.yaml)."""
        return (self.config().get("model") or {}).get("arch") or {}

    def optim(self) -> dict[str, Any]:
        """``model.optim`` of the run's config ({} without config.yaml)."""
        return (self.config().get("model") or {}).get("optim") or {}

    def init(self) -> str | None:
        """The weight init the run trained from (runs from before it was named: gpt2); None without config.yaml."""
        return self.arch().get("init", "gpt2") if self.config_path.is_file() else None


def after_a_failed_checkpoint(path: Path) -> str:
    """Which checkpoint of the run that ``path`` (a checkpoint that could not be written) belongs to is good, and
    how to go on."""
    run = RunDir(path.parent.parent)
    last = run.last_checkpoint
    if path.parent != run.checkpoints_dir or not last.is_file():
        return "free some space (or choose --run.root on another disk) and train again"
    try:
        step = int(read_checkpoint_file(last, mmap=True)["global_step"])
    except (CheckpointFileError, KeyError, TypeError, ValueError):
        return f"its last checkpoint {last} cannot be read; free some space and train again"
    return (
        f"nothing is lost: {last} is whole, at step {step}. Free some space (or move the run directory to another "
        "disk), then resume it with the same command and RESUME=last (--ckpt_path last)"
    )


TRAINING_SOURCES = ("resnorm_lm", "recipes", "pyproject.toml")  # what a run's numbers can depend on in the checkout


def code_revision() -> str:
    """The git commit of the code, with '+dirty' when what training reads (``TRAINING_SOURCES``) has uncommitted
    changes (results or docs changed or left out beside it do not make the code dirty); an installed wheel's
    version (never the git state of whatever repository its environment sits in)."""
    checkout = source_checkout()
    if checkout is None:
        try:
            return f"resnorm-lm {metadata.version('resnorm-lm')} (installed package)"
        except metadata.PackageNotFoundError:
            return "unknown"
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *TRAINING_SOURCES],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=True,
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    names = ["torch", "lightning", "torchmetrics", "datasets", "tokenizers", "jsonargparse", "numpy", "triton"]
    out = {"python": sys.version.split()[0]}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def cpu_model_and_bf16() -> tuple[str, bool]:
    """The CPU's model name and whether it has native bf16 arithmetic (AVX512_BF16 or AMX; BF16 on Arm)."""
    features = cpu_features()
    return features.get("cpu_name") or platform.machine(), bool(native_bf16_flags(features))


def hardware() -> dict[str, Any]:
    model, bf16 = cpu_model_and_bf16()
    info: dict[str, Any] = {"platform": platform.platform(), "cpu": model, "cpu_native_bf16": bf16}
    info["cpu_count"] = os.cpu_count()
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


class RunManifest(L.Callback):
    """Writes ``manifest.json`` at the start of fitting: code, versions, hardware, data, seed, profile."""

    def __init__(
        self,
        run_dir: Path,
        run: RunConfig,
        seed: int | None,
        precision: PrecisionChoice | None = None,
        resumed_from_step: int | None = None,
        kernels: dict[str, str] | None = None,
    ) -> None:
        self.run_dir, self.run, self.seed, self.precision = run_dir, run, seed, precision
        self.resumed_from_step = resumed_from_step
        self.kernels = kernels or {}  # what runs the step and why: compile, the CPU attention kernel

    @rank_zero_only
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """One segment per start or resume, in order; the top level describes the run and its latest segment."""
        manifest = getattr(trainer.datamodule, "manifest", None)
        data = None
        if manifest is not None:
            data = {
                "corpus": manifest.corpus,
                "corpus_fingerprint": manifest.corpus_fingerprint,
                "corpus_revision": manifest.corpus_revision,
                "tokenizer_sha256": manifest.tokenizer_sha256,
                "vocab_size": manifest.vocab_size,
                "splits": {k: vars(v) for k, v in manifest.splits.items()},
            }
        segment = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "arithmetic": run_arithmetic(trainer, pl_module),
            "resumed_from_step": self.resumed_from_step or 0,
            "host": platform.node(),
            "code_revision": code_revision(),
            "packages": package_versions(),
            "hardware": hardware(),
            "precision": str(trainer.precision),
            "precision_reason": self.precision.reason if self.precision else None,
            "kernels": self.kernels,
            "world_size": trainer.world_size,
        }
        run_dir = RunDir(self.run_dir)
        earlier = run_dir.manifest() if self.resumed_from_step is not None else {}
        segments = earlier.get("segments") or ([legacy_segment(earlier)] if earlier else [])
        manifest = {
            "recipe": self.run.recipe,
            "base_recipe": self.run.base,
            "tuned_overlay": self.run.tuned_overlay or None,  # where LR and warmup came from ("none": untuned)
            "profile": self.run.profile,
            "seed": self.seed,
            "seeds": {
                "init": self.seed if pl_module.init_seed is None else pl_module.init_seed,  # what each sets
                "data_order": getattr(trainer.datamodule, "seed", None),
            },
            **segment,
            "started": earlier.get("started", segment["started"]),  # when the run began
            "data": data,
            "parameters": count_parameters(pl_module),
            "init": pl_module.arch.init,  # how the weights started (model.arch.init)
            "segments": [*segments, segment],
        }
        write_json_atomic(run_dir.manifest_path, manifest)
        for logger in trainer.loggers:  # a W&B run gets the manifest too (code, versions, hardware, arithmetic)
            if type(logger).__name__ == "WandbLogger":
                logger.experiment.config.update({"manifest": manifest}, allow_val_change=True)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """The run a checkpoint belongs to and what its data position is counted in (resume checks)."""
        checkpoint["run"] = {
            "recipe": self.run.recipe,
            "profile": self.run.profile,
            "tag": self.run.tag,
            "seed": self.seed,
            "world_size": trainer.world_size,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
        }


def run_arithmetic(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
    """What sets the run's arithmetic here, and its fingerprint (``arithmetic.py``), measured on its device."""
    from resnorm_lm.train.arithmetic import describe, fingerprint

    precision, device = str(trainer.precision), pl_module.device
    batch = getattr(trainer.datamodule, "batch_size", 1)
    return {**describe(device, precision), "fingerprint": fingerprint(pl_module.arch, batch, device, precision)}


def legacy_segment(manifest: dict[str, Any]) -> dict[str, Any]:
    """The one segment a manifest written before segments were kept describes."""
    keys = (
        "started",
        "resumed_from_step",
        "host",
        "code_revision",
        "packages",
        "hardware",
        "precision",
        "precision_reason",
        "world_size",
        "ended",
    )
    return {k: manifest[k] for k in keys if k in manifest}


class StopAfterSteps(L.Callback):
    """Stops training at a step before max_steps, leaving the LR schedule (set by max_steps) unchanged.

    The checkpoint callbacks run after this one (Lightning orders them last), so
    a step that is a multiple of ``run.checkpoint_every`` is saved before stopping.
    """

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def tokens_seen(trainer: L.Trainer, batch_size: int, block_size: int) -> int:
    """Training tokens consumed over all ranks: steps x accumulation x batch x context x ranks."""
    return trainer.global_step * trainer.accumulate_grad_batches * batch_size * block_size * trainer.world_size


def result_line(summary: dict[str, Any]) -> str:
    """``RESULT key=value ...``: the one line every training run ends with."""
    keys = [
        "run",
        "step",
        "val_loss",
        "val_ppl",
        "val_bpb",
        "val_word_ppl",
        "tokens",
        "params",
        "wall_s",
        "diverged",
        "preempted",
    ]
    parts = []
    for key in keys:
        if summary.get(key) is not None and not (key == "preempted" and not summary[key]):
            value = summary[key]
            parts.append(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
    return "RESULT " + " ".join(parts)


# ---------------------------------------------------------------------------------------------------------------------
# One training process per run directory: an exclusive lock on ``<run dir>/.lock``, held while the run trains.
#
# Two processes training one run directory (the same ``make train`` started twice, a ``compare`` started again
# while the runs of an earlier one it was killed out of still train, a job requeued while its first instance
# lingers) would overwrite each other's checkpoints and interleave their metrics. The second one is refused
# with who holds the run. The lock is ``flock``: the kernel releases it when its process ends however it ends
# (SIGKILL, a crash, the node gone for NFS's lock recovery), so a lock is never stale; the file's text (pid,
# host, start time) only names the holder. Under DDP only global rank 0 takes it: every rank trains the run.

LOCK_NAME = ".lock"
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})  # a filesystem without flock


HELD: set[RunLock] = set()  # the locks this process holds: release_all() drops them


class RunDirectoryInUse(ResnormError, RuntimeError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """The lock of one run directory, held from ``acquire`` until ``release`` or the end of the process."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock, or raise RunDirectoryInUse naming its holder. A filesystem without locks: a warning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "a process that has not written its name yet"
            f.close()
            raise RunDirectoryInUse(
                f"{self.path.parent} is being trained by another process ({holder}): two processes would "
                "overwrite each other's checkpoints and metrics. Wait for it to finish, or stop it (SIGTERM saves "
                "its checkpoint at the end of the current step) and continue with RESUME=last"
            ) from None
        except OSError as err:
            f.close()
            if err.errno not in NO_LOCKS:
                raise
            print(
                f"resnorm-lm: warning: cannot lock {self.path} ({err.strerror}): this filesystem has no file "
                "locks, so make sure no other process trains this run",
                file=sys.stderr,
                flush=True,
            )
            return
        started = datetime.now(UTC).isoformat(timespec="seconds")
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n")
        f.flush()
        self.file = f
        HELD.add(self)

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the descriptor releases the flock
            self.file = None
        HELD.discard(self)

    @property
    def held(self) -> bool:
        return self.file is not None


def release_all() -> None:
    """Drop every run lock this process holds: a fit called in-process (``resnorm_lm.cli.main``) that ended with an
    error leaves none behind for the next call (a process that ends drops its locks anyway)."""
    for lock in list(HELD):
        lock.release()


# ---------------------------------------------------------------------------------------------------------------------
# The end of a training run: final validation, ``eval.json`` and the ``RESULT`` line.


def finish_run(trainer: L.Trainer, model, datamodule, run: RunConfig, run_dir: Path, preempted: bool = False) -> dict:
    """Validate the final weights (unless that step was just validated), then record and print the result.

    After a SIGTERM the run only records where it stopped: the scheduler's grace period is short.
    """
    diverged = model.guard.diverged
    if not preempted and getattr(model, "last_validated_step", None) != trainer.global_step:
        trainer.validate(model, datamodule=datamodule, verbose=False)
    # a preempted run was not validated at its last step: no stale validation numbers in its summary
    metrics = {} if preempted else {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    summary = {
        "run": str(run_dir),
        "recipe": run.recipe,
        "profile": run.profile,
        "step": trainer.global_step,
        "finished": not preempted and (trainer.global_step >= trainer.max_steps or diverged is not None),
        "preempted": preempted,
        "val_loss": metrics.get(VAL_LOSS),
        "val_ppl": metrics.get("val/ppl"),
        "val_bpb": metrics.get("val/bpb"),
        "val_word_ppl": metrics.get("val/word_ppl"),
        "val_targets": int(metrics.get("val/targets", 0)),
        "tokens": model.tokens_seen
        if model.tokens_seen is not None
        else tokens_seen(trainer, datamodule.batch_size, datamodule.block_size),
        "params": count_parameters(model),
        "wall_s": round(model.train_seconds(), 1),
        "diverged": diverged is not None or not math.isfinite(metrics.get(VAL_LOSS, 0.0)),
        "diverged_at_step": diverged["step"] if diverged else None,
        "diverged_reason": diverged["reason"] if diverged else None,
        "skipped_steps": model.guard.skipped,
        "clip": model.clips.summary(),  # how often clipping by norm bound; None: no clipping by norm counted
    }
    if trainer.is_global_zero:
        write_json_atomic(RunDir(run_dir).summary_path, summary)
        record_in_manifest(run_dir, summary)
        if summary["diverged"]:
            print(
                f"resnorm-lm: DIVERGED at step {summary['diverged_at_step']}: {summary['diverged_reason']}; "
                "the last good checkpoint is checkpoints/last.ckpt",
                flush=True,
            )
        print(result_line(summary), flush=True)
        if run.sample_tokens > 0 and not preempted:
            print_sample(model, datamodule, run.sample_tokens)
    return summary


def record_in_manifest(run_dir: Path, summary: dict) -> None:
    """The manifest says how the run ended too: finished, preempted or diverged (and why)."""
    manifest = RunDir(run_dir).manifest()
    keys = ("step", "finished", "preempted", "diverged", "diverged_at_step", "diverged_reason", "skipped_steps")
    manifest["ended"] = {k: summary[k] for k in keys}
    if manifest.get("segments"):
        manifest["segments"][-1]["ended"] = manifest["ended"]
    write_json_atomic(RunDir(run_dir).manifest_path, manifest)


def print_sample(model, datamodule, n_tokens: int, seed: int = 0) -> None:
    """A sample from the trained model, starting at an end-of-text token."""
    generator = torch.Generator(device=model.device).manual_seed(seed)
    pieces = stream_text(
        model.model, datamodule.prepared.tokenizer, [datamodule.manifest.eot_id], n_tokens, generator=generator
    )
    print("SAMPLE (temperature 0.8, top-k 50):\n" + "".join(pieces), flush=True)


def copy_small_files(run_dirs: list[Path], root: Path, dest: Path) -> int:
    """Copy each run's small files (``RunDir.small_files``) to the same place under ``dest``, each written whole;
    the runs whose files changed (or were not there); nothing is removed."""
    copied = 0
    for run_dir in run_dirs:
        changed = False
        for source in RunDir(run_dir).small_files():
            target = dest / source.relative_to(root)
            data = source.read_bytes()
            if not target.is_file() or target.read_bytes() != data:
                with atomic_write(target, "wb") as f:
                    f.write(data)
                changed = True
        copied += changed
    return copied
