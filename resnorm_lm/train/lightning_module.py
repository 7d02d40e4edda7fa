"""``LanguageModel``: the GPT as a LightningModule (loss, optimizer, metrics, resumable state)."""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torchmetrics import Metric

from resnorm_lm.model import exported
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.targets import IGNORE_INDEX
from resnorm_lm.train.callbacks import ends_optimizer_step
from resnorm_lm.train.diagnostics import (
    ATTN_LOGIT_MAX,
    CLIP_BOUND,
    CLIP_FRACTION,
    DIAGNOSTICS_STEP,
    GRAD_NORM_TOTAL,
    GRAD_NORMS,
    STREAM_RMS,
    TRAIN_LOSS,
    TRAIN_SECONDS,
    AttentionLogitMax,
    ClipRecord,
    ReadoutMean,
    StreamRMS,
    block_column,
    grad_norms,
)
from resnorm_lm.train.divergence import DivergenceConfig, DivergenceGuard, LossWindow, ReadVerdicts
from resnorm_lm.train.optim import OptimConfig, build_optimizer, parameter_groups
from resnorm_lm.train.resume import arch_differences


class SplitMetric(Metric):
    """One number of an evaluation split (loss, ppl, bpb, word_ppl or targets) from the summed NLL and
    target count, which torchmetrics sums across ranks; logged as a Metric object, so Lightning knows
    it is already reduced (no per-metric sync_dist warning, no second reduction)."""

    full_state_update = False

    def __init__(self, quantity: str) -> None:
        super().__init__()
        self.quantity = quantity
        self.split_sizes = (0, 0, 0)  # the whole split's targets, bytes and words: set before each pass
        self.add_state("nll", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("targets", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, nll_sum: torch.Tensor, n_targets: torch.Tensor) -> None:
        self.nll += nll_sum.double()
        self.targets += n_targets

    def compute(self) -> torch.Tensor:
        targets = int(self.targets)
        values = split_metrics(float(self.nll), targets, *self.split_sizes)
        return torch.tensor(targets if self.quantity == "targets" else values[self.quantity], dtype=torch.float64)


class SplitMetrics(torch.nn.ModuleDict):
    """The ``SplitMetric`` of every quantity for one split."""

    QUANTITIES = ("loss", "ppl", "bpb", "word_ppl", "targets")

    def __init__(self) -> None:
        super().__init__({q: SplitMetric(q) for q in self.QUANTITIES})

    def start(self, split_targets: int, split_bytes: int, split_words: int) -> None:
        for metric in self.values():
            metric.split_sizes = (split_targets, split_bytes, split_words)

    def available(self) -> list[str]:
        """bpb needs the split's bytes and word_ppl its words (a corpus may define neither)."""
        _, split_bytes, split_words = self["loss"].split_sizes
        missing = {"bpb": not split_bytes, "word_ppl": not split_words}
        return [q for q in self.QUANTITIES if not missing.get(q, False)]


def split_metrics(nll: float, targets: int, split_targets: int, split_bytes: int, split_words: int) -> dict[str, float]:
    """Loss, token perplexity, bits per byte and word-level perplexity of a split.

    bpb and word perplexity convert the mean loss per token with the split's
    bytes (words) per target token, so they are exact when the whole split was
    evaluated and an estimate on a subset (limit_val_batches).
    """
    loss = nll / max(targets, 1)
    out = {"loss": loss, "ppl": math.exp(min(loss, 700.0))}
    if split_bytes:
        out["bpb"] = loss * split_targets / (math.log(2) * split_bytes)
    if split_words:
        out["word_ppl"] = math.exp(min(loss * split_targets / split_words, 700.0))
    return out


class LanguageModel(L.LightningModule):
    """Cross-entropy training of a ``GPT`` with AdamW and a named LR schedule (schedules.py), and split metrics.

    Args:
        arch: the model architecture (norm, backend, placement, sizes).
        optim: optimizer and learning-rate schedule.
        log_grad_norms: log total and per-layer gradient norms, the RMS of the residual stream leaving each
            block and each attention's largest logit, every ``log_every_n_steps``.
        divergence: when a step's loss counts as diverged (NaN/Inf, or a factor above its running minimum),
            whether a bad step stops the run or is skipped, and where it is judged (host, or on the
            device with the fused optimizer skipping it there: resnorm_lm/train/divergence.py). A step
            is judged whole (all its micro-batches) and for all DDP ranks at once.
        init_seed: the weights' seed; None (the default): the run's seed, which sets the data order too.
        init_from: a folder ``resnorm-lm export`` wrote: the weights start as its (its architecture must be this
            run's), not from ``init``.
        compile: torch.compile the GPT in place (``nn.Module.compile``: state-dict keys unchanged, so
            checkpoints stay interchangeable). Opt-in: see docs/benchmarks.md for its effect here.
    """

    def __init__(
        self,
        arch: GPTConfig = GPTConfig(),  # noqa: B008 (a frozen default: never mutated)
        optim: OptimConfig = OptimConfig(),  # noqa: B008
        log_grad_norms: bool = True,
        divergence: DivergenceConfig = DivergenceConfig(),  # noqa: B008
        compile: bool = False,
        init_seed: int | None = None,
        init_from: str | None = None,
    ) -> None:
        super().__init__()
        self.arch = arch
        self.optim = optim
        self.guard = DivergenceGuard(divergence)
        self.verdicts_on_device = False  # set by configure_optimizers: the fused optimizer applies the verdicts
        self.losses = LossWindow()  # the micro-batch losses of the optimizer step being accumulated
        self.drop_step = False  # a host verdict: the step about to run is bad, its gradients are dropped
        self.clips = ClipRecord()  # how often clipping by norm bound
        self.compile_model = compile
        self.log_grad_norms = log_grad_norms
        self.save_hyperparameters({"arch": asdict(self.arch), "optim": asdict(self.optim)})
        self.init_seed = init_seed
        with torch.random.fork_rng(devices=[], enabled=init_seed is not None):
            torch.manual_seed(init_seed) if init_seed is not None else None  # the run's RNG stream untouched
            self.model = GPT(self.arch)
        if optim.lr_multipliers:  # a pattern that matches no parameter fails here, before any data is prepared
            parameter_groups(self.model, optim.weight_decay, optim.lr, optim.lr_multipliers)
        if init_from is not None:
            self.model.load_state_dict(exported_weights(init_from, self.arch))
        self.stream_rms = StreamRMS(self.model)  # read in the training forward of logging steps
        self.readout_mean = ReadoutMean(self.model)  # likewise
        self.attention_logits = AttentionLogitMax(self.model)  # likewise
        self.train_seconds_before = 0.0  # wall time of earlier segments of a resumed run
        self.tokens_seen: int | None = 0  # training tokens consumed on all ranks (None: resumed from an old file)
        self.schedule_steps: int | None = None  # the max_steps of the LR schedule: a resumed run keeps its own
        self.fit_started_at = time.time()
        self.val_metrics = SplitMetrics()
        self.test_metrics = SplitMetrics()

    # ------------------------------------------------------------------ training

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits, _ = self.model(idx)  # (B, T, V)
        return logits

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch  # (B, T) each
        recorders, logs = (self.stream_rms, self.readout_mean, self.attention_logits), self._logs_diagnostics()
        for recorder in recorders:
            recorder.active = logs
        _, loss = self.model(x, y)
        for recorder in recorders:
            recorder.active = False
        self.losses.add(loss)
        # never None (Lightning refuses that under DDP): a bad step is skipped whole at its optimizer step
        if ends_optimizer_step(self.trainer, batch_idx):
            self._judge_step()  # before the last backward, so a host verdict waits for this forward pass only
        self.log(TRAIN_LOSS, loss, on_step=True, prog_bar=True)
        return loss

    def _judge_step(self) -> None:
        """One verdict for the optimizer step about to run, the same on every rank: on the worst and best loss of
        every micro-batch of the window on every rank (``LossWindow``: one small all-reduce under DDP)."""
        self.guard.judge(self.losses.take(), self.trainer.global_step)  # (3,): worst and best over the window
        if self.verdicts_on_device:  # the fused optimizer skips a bad step there
            return
        verdict = self.guard.read()  # the host's way: the verdict now, its one sync
        self.drop_step = verdict != "ok"
        if verdict == "stop":
            self.trainer.should_stop = True

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradient norms before clipping; then a bad step is skipped whole, on every rank alike."""
        if self.losses.summary is not None:  # only if ends_optimizer_step stopped agreeing with Lightning's rule
            raise RuntimeError(
                "an optimizer step whose last micro-batch was not judged by the divergence guard: "
                "resnorm_lm/train/callbacks.py no longer agrees with this Lightning version's accumulation"
            )
        self._log_grad_norms()
        if self.verdicts_on_device:
            optimizer.found_inf = self.guard.take_mask()  # 1: the fused step leaves every state as it was
        elif self.drop_step:
            # every torch optimizer leaves a parameter without a gradient as it was (weights, moments, step
            # count), fused or not, and under 16-mixed too: the GradScaler's skip flag stays its own
            optimizer.zero_grad(set_to_none=True)
            self.drop_step = False

    def _logs_diagnostics(self) -> bool:
        """Whether this step logs the per-block diagnostics (gradient norms, the residual stream's RMS)."""
        return self.log_grad_norms and self.trainer.global_step % max(self.trainer.log_every_n_steps, 1) == 0

    def _log_grad_norms(self) -> None:
        trainer = self.trainer
        if not self._logs_diagnostics():
            return
        total, per_layer = grad_norms(self.model)  # one host sync for all of them
        metrics = {DIAGNOSTICS_STEP: float(trainer.global_step), GRAD_NORM_TOTAL: total}  # the norm before clipping
        clip = trainer.gradient_clip_val
        if clip and trainer.gradient_clip_algorithm != "value":
            metrics[CLIP_BOUND] = float(total + 1e-6 > clip)  # this step's; torch's rule (clipping.py)
        if self.clips.counts is not None:
            steps, clipped = self.clips.counts  # the steps before this one
            metrics[CLIP_FRACTION] = clipped / steps
        metrics.update({block_column(GRAD_NORMS, i): g for i, g in enumerate(per_layer)})
        stream = self.stream_rms.take()  # this step's forward passes
        if stream:
            metrics.update({block_column(STREAM_RMS, i): r for i, r in enumerate(torch.stack(stream).tolist())})
        logits = {block_column(ATTN_LOGIT_MAX, i): z for i, z in enumerate(self.attention_logits.take())}
        measured = {**self.readout_mean.take(), **logits, **self.model.stream.diagnostics()}  # 0-dim tensors by column
        if measured:
            metrics.update(zip(measured, torch.stack([v.float() for v in measured.values()]).tolist(), strict=True))
        self.log_dict(metrics, on_step=True, on_epoch=False)

    def configure_optimizers(self):
        on_cuda = all(p.is_cuda for p in self.model.parameters())
        self.verdicts_on_device = self._verdict_on_device(on_cuda)
        # fused: one kernel per step where torch has it (build_optimizer's default), and the only AdamW that can
        # skip a step on the device; not under 16-mixed, whose GradScaler must unscale before Lightning clips (a
        # fused step unscales inside)
        fused = True if self.verdicts_on_device else (False if self._grad_scaler() else None)
        self.schedule_steps = self.schedule_steps or self.trainer.max_steps  # set from the checkpoint on resume
        optimizer, schedule = build_optimizer(self.model, self.optim, self.schedule_steps, fused=fused)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip by norm here, counting the steps where it binds (``ClipRecord``), and a fused optimizer's gradients
        by value: Lightning's mixed-precision plugin refuses to clip for any optimizer that can unscale inside its
        step (fused AdamW), even under bf16, where nothing is scaled and the gradients are the true ones. With a
        GradScaler (16-mixed: never fused) Lightning clips, and nothing is counted."""
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        by_value = gradient_clip_algorithm == "value"
        if not gradient_clip_val or self._grad_scaler() or (by_value and not fused):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if by_value:
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val, foreach=True)
        elif params:  # none: a step the divergence guard dropped, not counted
            self.clips.clip(params, gradient_clip_val)  # torch's clip_grad_norm_, counted

    def _grad_scaler(self) -> bool:
        return str(self.trainer.precision) == "16-mixed"

    def _verdict_on_device(self, on_cuda: bool) -> bool:
        scaler = self._grad_scaler()  # its GradScaler sets the optimizer's found_inf itself
        choice = self.guard.config.verdict
        if choice == "device" and scaler:
            raise ValueError(
                "divergence.verdict=device cannot be used with precision 16-mixed (the GradScaler owns the fused "
                "optimizer's skip flag); use divergence.verdict=host or auto, or bf16-mixed"
            )
        return choice == "device" or (choice == "auto" and on_cuda and not scaler)

    def configure_callbacks(self) -> list[L.Callback]:
        if any(isinstance(c, ReadVerdicts) for c in self.trainer.callbacks):  # the final validate, after the fit
            return []
        return [ReadVerdicts()]  # a no-op with host verdicts

    @property
    def flops_per_batch(self) -> int | None:
        """Training FLOPs of one batch (``GPT.flops_per_token`` x its tokens), for ThroughputMonitor."""
        batch = getattr(self._datamodule(), "batch_size", None)
        if batch is None:
            return None
        return self.model.flops_per_token() * batch * self.arch.block_size

    # ------------------------------------------------------------------ evaluation

    def _eval_step(self, batch: tuple[torch.Tensor, torch.Tensor], prefix: str, metrics: SplitMetrics) -> None:
        x, y = batch  # (B, T) each; padded targets are IGNORE_INDEX
        _, nll = self.model(x, y, reduction="sum")  # the summed NLL, without the (B, T, V) logits
        n_targets = (y != IGNORE_INDEX).sum()
        for quantity in metrics.available():
            metrics[quantity].update(nll, n_targets)
            self.log(
                f"{prefix}/{quantity}", metrics[quantity], on_step=False, on_epoch=True, prog_bar=quantity == "ppl"
            )

    def _start_split(self, split: str, metrics: SplitMetrics) -> None:
        dm = self.trainer.datamodule
        if dm is None:  # a bare Trainer with loaders only: the pass's own targets, no bytes or words
            metrics.start(0, 0, 0)
            return
        metrics.start(dm.eval_windows(split).n_targets, dm.split_bytes(split), dm.split_words(split))

    def on_validation_epoch_start(self) -> None:
        self._start_split("validation", self.val_metrics)

    def on_test_epoch_start(self) -> None:
        self._start_split("test", self.test_metrics)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_metrics)

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_metrics)

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.last_validated_step = self.trainer.global_step

    def configure_model(self) -> None:
        if self.compile_model:
            self.model.compile()

    def on_fit_start(self) -> None:
        self.fit_started_at = time.time()

    def train_seconds(self) -> float:
        """Wall time spent in fit() so far, resumed segments added up."""
        return self.train_seconds_before + (time.time() - self.fit_started_at)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        # counted as the batch starts, so a checkpoint written at this batch's end includes it
        if self.tokens_seen is not None:
            self.tokens_seen += batch[0].numel() * self.trainer.world_size  # (B, T) windows on each rank

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.trainer.global_step % max(self.trainer.log_every_n_steps, 1) == 0:
            self.log(TRAIN_SECONDS, self.train_seconds(), on_step=True, on_epoch=False)

    # ------------------------------------------------------------------ checkpoints

    def _datamodule(self) -> L.LightningDataModule | None:
        """The trainer's data module; None without a trainer, or with a bare Trainer given loaders only."""
        try:
            return self.trainer.datamodule
        except RuntimeError:  # not attached to a Trainer
            return None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add what Lightning does not save: RNG states, and the data identity for resume checks."""
        checkpoint["train_seconds"] = self.train_seconds()
        checkpoint["precision"] = str(self.trainer.precision)  # a resumed run keeps it (precision: auto)
        checkpoint["tokens_seen"] = self.tokens_seen
        checkpoint["schedule_max_steps"] = self.schedule_steps  # extending a run keeps its schedule (resume.py)
        self.guard.collect()  # the records up to this step
        checkpoint["divergence_guard"] = self.guard.state_dict()
        checkpoint["clip_record"] = self.clips.state_dict()
        checkpoint["rng_states"] = {
            "python": random.getstate(),
            "numpy": numpy_rng_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        manifest = getattr(self._datamodule(), "manifest", None)
        if manifest is not None:
            checkpoint["data_identity"] = data_identity(manifest)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint.get("hyper_parameters", {}).get("arch")
        if saved is None:
            raise ValueError("not a resnorm-lm checkpoint: it has no 'arch' hyperparameters")
        diff = arch_differences(saved, asdict(self.arch))  # the CLI checked this already; Trainer.fit users too
        if diff:
            details = ", ".join(diff)
            raise ValueError(
                f"the checkpoint was trained with a different architecture ({details}); "
                "resume with the recipe and profile it was trained with, or start a new run"
            )
        manifest = getattr(self._datamodule(), "manifest", None)
        if manifest is not None and "data_identity" in checkpoint:
            differences = identity_differences(checkpoint["data_identity"], data_identity(manifest))
            if differences:
                raise ValueError(
                    f"the checkpoint was trained on different data or tokenizer ({'; '.join(differences)}); "
                    "resume with the same data settings, or start a new run"
                )
        self.train_seconds_before = float(checkpoint.get("train_seconds", 0.0))
        self.tokens_seen = checkpoint.get("tokens_seen")  # None in files from before it was counted
        self.schedule_steps = checkpoint.get("schedule_max_steps")  # before configure_optimizers builds it
        self.clips.load_state_dict(checkpoint.get("clip_record", {}))
        if "divergence_guard" in checkpoint:
            self.guard.load_state_dict(checkpoint["divergence_guard"])  # device verdicts start from these
        states = checkpoint.get("rng_states")
        if states is not None:
            random.setstate(states["python"])
            set_numpy_rng_state(states["numpy"])
            torch.set_rng_state(states["torch"])
            if states["cuda"] and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda"])


def numpy_rng_state() -> dict:
    """numpy's global RNG state as tensors and ints, loadable as data (resnorm_lm/train/checkpoint_io.py)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def set_numpy_rng_state(state: dict) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["name"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"]))


def data_identity(manifest) -> dict[str, str]:
    """What must match between a checkpoint and the data it resumes on, is evaluated on or samples with:
    the documents (their fingerprint), the upstream revision they were read at (Hub corpora) and the tokenizer."""
    identity = {"corpus_fingerprint": manifest.corpus_fingerprint, "tokenizer_sha256": manifest.tokenizer_sha256}
    if getattr(manifest, "corpus_revision", None):
        identity["corpus_revision"] = manifest.corpus_revision
    return identity


def identity_differences(then: dict[str, str], now: dict[str, str]) -> list[str]:
    """``"key: checkpoint X vs now Y"`` for each part of a checkpoint's data identity that ``now`` does not match.

    Only the keys the checkpoint records count: one written before a key existed is judged on the others.
    """
    return [
        f"{key}: checkpoint {then[key]} vs now {now.get(key, 'none')}"
        for key in sorted(then)
        if now.get(key) != then[key]
    ]


def exported_weights(folder: str, arch: GPTConfig) -> dict[str, torch.Tensor]:
    """The weights of an export (``resnorm_lm/model/exported.py``) for a model of ``arch``; refused, with what
    differs, when the export's architecture is another (the fused or the plain norm backend is the same)."""
    cfg, state, _ = exported.read(Path(folder))
    theirs, ours = asdict(cfg), asdict(arch)
    differ = [
        f"{k}: export {theirs[k]!r}, this run {ours[k]!r}"
        for k in ours
        if k != "norm_backend" and theirs.get(k) != ours[k]
    ]
    if differ:
        raise exported.ExportError(f"model.init_from={folder}: its architecture is not this run's: {'; '.join(differ)}")
    return state
