"""ResnormCLI: LightningCLI (fit, validate, test) with recipes, profiles, run directories and resume checks.

``resnorm_lm.cli`` (the ``resnorm-lm`` command) expands ``--recipe``/``--profile`` and hands ``fit`` here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path

import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only

from resnorm_lm.data.cache import remove_temp_files
from resnorm_lm.data.datamodule import DEFAULT_DATA_SEED, TextDataModule
from resnorm_lm.errors import ResnormError
from resnorm_lm.train.callbacks import ContinuedCSVLogger, FinalCheckpoint, GoodStateCheckpoint, SparseThroughputMonitor
from resnorm_lm.train.checkpoint_io import AtomicCheckpointIO
from resnorm_lm.train.config_checks import check_hardware, check_memory, check_trainer_numbers
from resnorm_lm.train.cpu_attention import use_for_run
from resnorm_lm.train.diagnostics import VAL_LOSS
from resnorm_lm.train.lightning_module import LanguageModel
from resnorm_lm.train.loaded_run import data_differences
from resnorm_lm.train.precision import (
    PrecisionChoice,
    PrecisionError,
    Trainer,
    resolve_precision,
    tf32_wanted,
    uses_cuda,
)
from resnorm_lm.train.preemption import Preemption, SlurmJob, cluster_plugins, resume_after_requeue
from resnorm_lm.train.resume import CheckpointFacts, ResumeRequest, check_resume
from resnorm_lm.train.runs import (
    RunConfig,
    RunDir,
    RunDirectoryInUse,
    RunLock,
    RunManifest,
    StopAfterSteps,
    run_directory,
)

MIN_FREE_DISK_BYTES = 200 * 2**20  # refuse to start a run with less free space than this
EXIT_DIVERGED = 3  # the run diverged: last.ckpt is the last good state


class UsageError(ResnormError, ValueError):
    """A mistake in the command line or config that the user fixes; printed without a traceback."""


class ResnormCLI(LightningCLI):
    """LightningCLI for ``LanguageModel`` x ``TextDataModule`` with resnorm-lm's run directories."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        self.pin_in_argv = args is None  # parsed from sys.argv, which DDP relaunches
        super().__init__(
            LanguageModel,
            TextDataModule,
            trainer_class=Trainer,
            args=args,
            run=run,
            auto_configure_optimizers=False,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": "resnorm-lm: GPT LMs with swappable norms and residual placements"},
        )

    def _parse_ckpt_path(self) -> None:
        """Not LightningCLI's: for a --ckpt_path file it replaces model.* by the checkpoint's hyperparameters
        before any check, dropping overrides in silence. Here a resume is checked against its checkpoint
        (resnorm_lm/train/resume.py), for a path and for ``last`` alike."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(RunConfig, "run")
        # vocabulary and context are data settings the model must agree with: typed once
        parser.link_arguments("data.vocab_size", "model.arch.vocab_size")
        parser.link_arguments("data.block_size", "model.arch.block_size")

    # ------------------------------------------------------------------ before anything is built

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        self.run_config = RunConfig(**vars(cfg.run))
        check_settings(cfg)
        if self.run_config.logger == "wandb" and importlib.util.find_spec("wandb") is None:
            raise UsageError(
                "run.logger=wandb needs the wandb package, an optional extra: pip install 'resnorm-lm[wandb]' "
                "(make install includes it), or leave run.logger at csv"
            )
        seed = None if cfg.seed_everything is False else cfg.seed_everything  # an int once Lightning resolved True
        if cfg.data.seed is None:  # seed k sets the data order too, the same for every recipe: runs pair by seed
            cfg.data.seed = seed if seed is not None else DEFAULT_DATA_SEED
        self.run_dir = run_directory(
            self.run_config, cfg.seed_everything, data_seed=cfg.data.seed, init_seed=cfg.model.init_seed
        )
        self.slurm_job = SlurmJob.from_environment()  # None unless this process is a task that srun started
        self.resume_step: int | None = None
        self.resume_precision: str | None = None
        self.resume_facts: CheckpointFacts | None = None
        if self.subcommand == "fit":
            cfg.ckpt_path = self._resolve_resume(cfg.ckpt_path)
        self.precision_choice = self._choose_precision(cfg)
        self.kernel_choices = self._choose_kernels(cfg)

    def _choose_precision(self, cfg) -> PrecisionChoice:
        """Resolve ``auto`` once, say what was chosen and why, and pin it for relaunched DDP ranks."""
        try:
            tf32_wanted()  # RESNORM_LM_TF32, read when the Trainer is built: a bad value said now
            choice = resolve_precision(cfg.trainer.precision, uses_cuda(cfg.trainer.accelerator), self.resume_precision)
        except PrecisionError as err:
            raise UsageError(str(err)) from None
        if rank_zero_only.rank == 0:
            print(f"resnorm-lm: {choice.describe()}", file=sys.stderr, flush=True)
        cfg.trainer.precision = choice.precision
        if self.pin_in_argv:  # Lightning's DDP launcher re-runs sys.argv: every rank uses this precision
            sys.argv.append(f"--trainer.precision={choice.precision}")
        return choice

    def _choose_kernels(self, cfg) -> dict[str, str]:
        """Say whether the model is compiled and, on a CPU, set and say which attention kernel runs (measured)."""
        compiled = "on" if cfg.model.compile else "off"
        profile = self.run_config.profile
        choices = {
            "compile": f"torch.compile {compiled} (model.compile, set by the {profile} profile; "
            "`make bench` measures its saving per step against its compile time)"
        }
        arch, data = cfg.model.arch, cfg.data
        sizes = (arch.n_head, arch.n_embd, data.batch_size, data.block_size)
        shape_is_valid = all(isinstance(n, int) and n > 0 for n in sizes) and arch.n_embd % arch.n_head == 0
        if not uses_cuda(cfg.trainer.accelerator) and shape_is_valid:  # else the model's config error comes next
            try:
                line = use_for_run(cfg.trainer.precision, data.batch_size, arch.n_head, data.block_size, arch.n_embd)
            except ValueError as err:  # a kernel named in the environment that does not exist
                raise UsageError(str(err)) from None
            if line is not None:
                choices["attention"] = line
        if rank_zero_only.rank == 0:
            for line in choices.values():
                print(f"resnorm-lm: {line}", file=sys.stderr, flush=True)
        return choices

    def after_instantiate_classes(self) -> None:
        if self.subcommand == "fit":  # the config built: only now touch the disk
            if self.resume_facts is not None:  # the data's content as the checkpoint's, before anything is written
                differences = data_differences(self.datamodule, self.resume_facts.data_identity)
                if differences:
                    raise UsageError(
                        f"cannot resume from {self.resume_facts.path}: it was trained on different data or tokenizer "
                        f"({'; '.join(differences)}); the corpus files changed or another corpus is configured. "
                        "Resume with the same data, or start a new run"
                    )
            check_writable(self.run_dir)
            if rank_zero_only.rank == 0:  # the other DDP ranks train the same run
                try:
                    RunLock(self.run_dir).acquire()  # held until main() ends (run_lock.release_all) or the process
                except RunDirectoryInUse as err:
                    raise UsageError(str(err)) from None
            for stale in remove_temp_files(RunDir(self.run_dir).checkpoints_dir):
                print(f"resnorm-lm: removed {stale.name}, a checkpoint write that was killed midway", file=sys.stderr)

    def _resolve_resume(self, ckpt_path: str | None) -> str | None:
        last = RunDir(self.run_dir).last_checkpoint
        ckpt_path = resume_after_requeue(ckpt_path, last, self.slurm_job)
        if ckpt_path == "last":
            if not last.is_file():
                raise UsageError(
                    f"RESUME=last: there is no run to resume at {self.run_dir} (no checkpoints/last.ckpt); "
                    "train it first without RESUME"
                )
            ckpt_path = str(last)
        elif ckpt_path is None:
            if last.is_file():
                raise UsageError(
                    f"{self.run_dir} already holds a run (checkpoints/last.ckpt); continue it with RESUME=last "
                    f"(--ckpt_path last), or choose another SEED, or remove {self.run_dir}"
                )
            return None
        elif not Path(ckpt_path).is_file():
            raise UsageError(no_checkpoint_at(ckpt_path))
        facts = CheckpointFacts.read(Path(ckpt_path))
        # resumed on purpose: the run's own checkpoints folder is not empty, and Lightning need not say so
        own = os.path.realpath(RunDir(self.run_dir).checkpoints_dir)  # as ModelCheckpoint names it
        warnings.filterwarnings("ignore", message=rf"Checkpoint directory {re.escape(own)} exists and is not empty")
        for note in check_resume(facts, self._resume_request()):
            if rank_zero_only.rank == 0:
                print(f"resnorm-lm: resuming: {note}", file=sys.stderr, flush=True)
        self.resume_facts, self.resume_step, self.resume_precision = facts, facts.global_step, facts.precision
        if self.resume_precision is None:  # a checkpoint from before precision was recorded in it
            self.resume_precision = recorded_precision(self.run_dir)
        return ckpt_path

    def _resume_request(self) -> ResumeRequest:
        cfg = self.config[self.subcommand]
        trainer = cfg.trainer.as_dict()
        run = {k: getattr(self.run_config, k) for k in ("recipe", "profile", "tag")}
        run.update(
            seed=cfg.seed_everything,
            world_size=processes(trainer),
            accumulate_grad_batches=trainer.get("accumulate_grad_batches") or 1,
        )
        return ResumeRequest(
            arch=cfg.model.arch.as_dict(),
            optim=cfg.model.optim.as_dict(),
            data=cfg.data.as_dict(),
            run=run,
            max_steps=trainer.get("max_steps") or -1,
        )

    # ------------------------------------------------------------------ the trainer

    def _config_dict(self) -> dict:
        """The resolved config as plain data (a W&B run's config)."""
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        return {k: v for k, v in cfg.as_dict().items() if k not in ("config", "ckpt_path")}

    def instantiate_trainer(self, **kwargs):
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        callbacks = list(trainer_cfg.get("callbacks") or [])
        if trainer_cfg.get("enable_progress_bar") is False:  # a profile's bar settings give way to turning it off
            callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
        run, run_dir = self.run_config, RunDir(self.run_dir)
        ckpt_dir = run_dir.checkpoints_dir
        callbacks += [
            GoodStateCheckpoint(
                dirpath=ckpt_dir,
                filename="step{step:06d}",
                every_n_train_steps=run.checkpoint_every,
                save_top_k=0,
                save_last=True,
                auto_insert_metric_name=False,
                # always last.ckpt: with a counter, a run resumed from a last.ckpt that a SIGTERM (not this
                # callback) wrote would go on saving last-v1.ckpt and leave last.ckpt stale
                enable_version_counter=False,
            ),
            ModelCheckpoint(
                dirpath=ckpt_dir,
                filename="best",
                monitor=VAL_LOSS,
                mode="min",
                save_top_k=1,
                auto_insert_metric_name=False,
                enable_version_counter=False,
            ),
            LearningRateMonitor(logging_interval="step"),
            SparseThroughputMonitor(  # the device synced on logging steps only
                batch_size_fn=lambda batch: batch[0].size(0), length_fn=lambda batch: batch[0].numel()
            ),
        ]
        if self.subcommand == "fit":
            seed = self._get(self.config, "seed_everything")
            callbacks.append(
                RunManifest(self.run_dir, run, seed, self.precision_choice, self.resume_step, self.kernel_choices)
            )
            last = run_dir.last_checkpoint
            preempt = Preemption(last, on_preempted=lambda: self._finish(preempted=True), job=self.slurm_job)
            callbacks += [preempt, FinalCheckpoint(last, run.checkpoint_every)]
            if run.stop_after_steps is not None:
                callbacks.append(StopAfterSteps(run.stop_after_steps))
        kwargs.update(
            callbacks=callbacks,
            logger=run_loggers(self.run_dir, self.resume_step, run, self._config_dict()),
            default_root_dir=str(self.run_dir),
            plugins=[AtomicCheckpointIO(), *cluster_plugins(self.slurm_job)],
        )
        strategy = trainer_cfg.get("strategy")
        if strategy == "ddp":
            if processes(trainer_cfg) == 1:  # no DDP wrapper (and its per-step cost) around a single device
                kwargs["strategy"] = "auto"
            else:  # the string gives the default 30-minute timeout: a dead rank would hang the job
                kwargs["strategy"] = DDPStrategy(timeout=timedelta(seconds=run.dist_timeout_s))
        return super().instantiate_trainer(**kwargs)

    # ------------------------------------------------------------------ after training

    def after_fit(self) -> None:
        summary = self._finish(preempted=False)
        self.exit_code = EXIT_DIVERGED if summary["diverged"] else 0

    def _finish(self, preempted: bool) -> dict:
        from resnorm_lm.train.runs import finish_run

        summary = finish_run(self.trainer, self.model, self.datamodule, self.run_config, self.run_dir, preempted)
        for logger in self.trainer.loggers:  # the W&B run ends with the fit, not with the process: the next fit
            if type(logger).__name__ == "WandbLogger" and logger._experiment is not None:  # in it starts anew
                logger.experiment.finish(exit_code=EXIT_DIVERGED if summary["diverged"] else 0)
        return summary


def check_settings(cfg) -> None:
    """Numbers, hardware and memory, before anything is prepared or written (resnorm_lm/train/config_checks.py)."""
    trainer = cfg.trainer.as_dict()
    problems = check_trainer_numbers(trainer)
    if problems:
        raise UsageError("invalid trainer settings:\n  " + "\n  ".join(problems))
    accelerator = trainer.get("accelerator")
    for problem in (
        check_hardware(accelerator),
        check_memory(cfg.model.arch.as_dict(), cfg.data.batch_size, uses_cuda(accelerator)),
    ):
        if problem:
            raise UsageError(problem)


def processes(trainer_cfg: dict) -> int:
    """How many training processes the trainer settings ask for: devices on this node x nodes."""
    devices, accelerator = trainer_cfg.get("devices", "auto"), str(trainer_cfg.get("accelerator", "auto"))
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif str(devices) in ("-1", "auto"):
        count = torch.cuda.device_count() if uses_cuda(accelerator) else 1
    else:
        count = int(devices)
    return count * int(trainer_cfg.get("num_nodes") or 1)


def recorded_precision(run_dir: Path) -> str | None:
    """The precision a run directory's manifest says the run trained with (None when unknown)."""
    return RunDir(run_dir).manifest().get("precision")


def run_loggers(run_dir: Path, resume_step: int | None, run: RunConfig, config: dict) -> list:
    """metrics.csv always; TensorBoard event files under tensorboard/ too when tensorboard is installed; with
    ``run.logger: wandb``, a W&B run beside them (its files under the run directory's wandb/; WANDB_MODE=offline
    keeps it there), named as the run directory, in ``run.group``, its config the run's resolved config (the
    manifest is added when the fit starts: ``RunManifest``)."""
    loggers = [ContinuedCSVLogger(run_dir, resume_step=resume_step)]
    if importlib.util.find_spec("tensorboard") is not None:
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version=""))
    if run.logger == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        name = f"{run.recipe}/{run_dir.name}"
        loggers.append(
            WandbLogger(
                name=name,
                save_dir=str(run_dir),
                project="resnorm-lm",
                group=run.group,
                config=config,
                id=wandb_run_id(run_dir),
                resume="allow",
            )
        )
    return loggers


def wandb_run_id(run_dir: Path) -> str:
    """One W&B run per run directory, resumes included: an id from the directory's path."""
    import hashlib

    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


def check_writable(run_dir: Path) -> None:
    """Fail before training when the run directory cannot be written or the disk is (nearly) full."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # a name of this process's own: every DDP rank probes the same folder at the same moment
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-probe-") as probe:
            probe.write(b"ok")
            probe.flush()
    except OSError as err:
        raise UsageError(f"cannot write the run directory {run_dir}: {err}; choose --run.root elsewhere") from None
    free = shutil.disk_usage(run_dir).free
    if free < MIN_FREE_DISK_BYTES:
        raise UsageError(
            f"only {free / 2**20:.0f} MiB free on the disk of {run_dir}; a run needs at least "
            f"{MIN_FREE_DISK_BYTES / 2**20:.0f} MiB for checkpoints: free space or choose --run.root elsewhere"
        )


def check_checkpoint_argument(args: list[str]) -> None:
    """A --ckpt_path file is read by LightningCLI while parsing: give a clear error for a bad one first."""
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--ckpt_path=") else None
        if arg == "--ckpt_path" and i + 1 < len(args):
            value = args[i + 1]
        if value not in (None, "last", "null", "None"):
            if not Path(value).is_file():
                raise UsageError(no_checkpoint_at(value))
            CheckpointFacts.read(Path(value))


def no_checkpoint_at(path: str) -> str:
    """What is wrong with a --ckpt_path that is not a file, and what to give instead."""
    if not Path(path).is_dir():
        return f"checkpoint {path} does not exist"
    last = RunDir(Path(path)).last_checkpoint
    latest = f" ({last} is its latest)" if last.is_file() else ""
    return (
        f"--ckpt_path {path} is a directory, not a checkpoint: give a .ckpt file{latest}, or `last` "
        "(RESUME=last) to resume the run this command names"
    )
