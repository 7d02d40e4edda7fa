"""What a resumed run must share with its checkpoint, checked before anything is built or written.

A resume continues one run. ``RESUME=last`` and ``RESUME=<path>`` are checked alike, against the
configuration the command line resolves to (recipe, profile, overrides), never by adopting the
checkpoint's own settings in silence:

* refused, with every difference spelled out: the architecture; the run it belongs to (recipe,
  profile, sweep tag, seed); the data settings; what the data position is counted in (batch size,
  data seed, ``random_offset``, accumulation, world size: the sampler restarts at
  ``global_step x accumulation`` batches of the current size on the current ranks); and the
  optimizer settings, which the optimizer and LR scheduler states restore whatever the config says;
* said aloud: a new ``max_steps``. The LR schedule stays the run's own (its warmup and decay placed over
  the run's first ``max_steps``), so extending a finished run continues at the floor rather than
  re-stretching the decay, which would jump the LR back up.

Checkpoints written before a fact was recorded are checked on what they hold; one written when warmups
were counted in steps is read as the fraction of its schedule's ``max_steps`` they were.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from resnorm_lm.errors import ResnormError
from resnorm_lm.model.gpt import GPTConfig
from resnorm_lm.train.checkpoint_io import CheckpointFileError, read_checkpoint_file
from resnorm_lm.train.optim import OptimConfig

DATA_KEYS = ("corpus", "vocab_size", "max_chars", "dtype")  # what the prepared data is (content: fingerprints)
ORDER_KEYS = ("batch_size", "seed", "random_offset")  # what the data position is counted in


class ResumeError(ResnormError, ValueError):
    """A resume that would not continue the checkpoint's run as configured."""


@dataclass(frozen=True)
class CheckpointFacts:
    """What a resume is checked against, read from a checkpoint without loading its tensors."""

    path: Path
    global_step: int
    precision: str | None
    arch: dict[str, Any] | None
    optim: dict[str, Any] | None
    data: dict[str, Any]  # the data module's hyperparameters
    run: dict[str, Any] | None  # recipe, profile, tag, seed, world_size, accumulate_grad_batches
    schedule_max_steps: int | None  # the max_steps the LR schedule was built for
    data_identity: dict[str, str] | None  # corpus fingerprint and tokenizer hash

    @classmethod
    def read(cls, path: Path) -> CheckpointFacts:
        try:
            ckpt = read_checkpoint_file(path, mmap=True)
        except CheckpointFileError as err:
            raise ResumeError(str(err)) from None
        if not isinstance(ckpt, dict) or "global_step" not in ckpt:
            raise ResumeError(f"{path} is not a Lightning checkpoint (no global_step)")
        hparams = ckpt.get("hyper_parameters") or {}
        optim = hparams.get("optim")
        if optim is not None:
            optim = optim_in_fractions(optim, ckpt.get("schedule_max_steps"))
        return cls(
            path,
            int(ckpt["global_step"]),
            ckpt.get("precision"),
            hparams.get("arch"),
            optim,
            dict(ckpt.get("datamodule_hyper_parameters") or {}),
            ckpt.get("run"),
            ckpt.get("schedule_max_steps"),
            ckpt.get("data_identity"),
        )


def optim_in_fractions(optim: dict[str, Any], max_steps: int | None) -> dict[str, Any]:
    """A checkpoint's optimizer settings with a warmup counted in steps (written before warmups were fractions of
    the run) restated as the ``warmup_fraction`` of its schedule's ``max_steps`` that it was, under the schedule
    it then had: cosine, or a whole-run ramp (``constant``) where the warmup was not below ``max_steps``."""
    if "warmup_steps" not in optim or not max_steps:
        return optim
    optim = dict(optim)
    steps = optim.pop("warmup_steps")
    optim["warmup_fraction"] = steps / max_steps
    optim.setdefault("schedule", "cosine" if steps < max_steps else "constant")
    return optim


@dataclass(frozen=True)
class ResumeRequest:
    """The run the command line asks for, as far as a resume must agree with it."""

    arch: dict[str, Any]
    optim: dict[str, Any]
    data: dict[str, Any]
    run: dict[str, Any]  # recipe, profile, tag, seed, world_size, accumulate_grad_batches
    max_steps: int


def differences(then: dict[str, Any], now: dict[str, Any], keys, prefix: str) -> list[str]:
    return [
        f"{prefix}{k}: checkpoint {then[k]!r}, now {now.get(k)!r}" for k in keys if k in then and then[k] != now.get(k)
    ]


def arch_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """How a checkpoint's architecture differs from ``now``; a key added since it was written has its default."""
    return differences({**asdict(GPTConfig()), **saved}, now, [f.name for f in fields(GPTConfig)], "model.arch.")


def check_resume(facts: CheckpointFacts, request: ResumeRequest) -> list[str]:
    """Raise ``ResumeError`` listing every setting the resume cannot keep; return what to say aloud."""
    problems: list[str] = []
    if facts.arch is not None:
        problems += arch_differences(facts.arch, request.arch)
    if facts.run is not None:
        problems += differences(facts.run, request.run, ("recipe", "profile", "tag", "seed"), "run: ")
        problems += differences(facts.run, request.run, ("world_size", "accumulate_grad_batches"), "trainer: ")
    problems += differences(facts.data, request.data, (*DATA_KEYS, *ORDER_KEYS), "data.")
    if facts.optim is not None:
        then = {**asdict(OptimConfig()), **facts.optim}
        problems += differences(then, request.optim, [f.name for f in fields(OptimConfig)], "model.optim.")
    if request.max_steps < facts.global_step:
        problems.append(f"trainer.max_steps: {request.max_steps} is before the checkpoint's step {facts.global_step}")
    if problems:
        raise ResumeError(
            f"cannot resume from {facts.path} as configured; it differs in:\n  " + "\n  ".join(problems) + "\n"
            "A resume continues the same run: give the settings it was trained with (its run directory's "
            "config.yaml holds them), or start a new run (another SEED or --run.tag) to change them."
        )
    notes = []
    planned = facts.schedule_max_steps
    if planned is not None and request.max_steps != planned:
        notes.append(
            f"trainer.max_steps is {request.max_steps}, the run's LR schedule was made for {planned} steps: it stays "
            f"so (cosine to its floor, lr x min_lr_ratio, at step {planned}, then constant at the floor)"
        )
    return notes
