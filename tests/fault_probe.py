"""A callback the fault tests pass on the command line: it kills or signals its own process at a chosen point.

RESNORM_LM_FAULT="<where>:<step>[:<rank>]" (only on that DDP rank), where is one of
  step        SIGKILL after backward, before the optimizer step of <step>
  validation  SIGKILL during the validation that follows <step>
  save        SIGKILL between writing a checkpoint's temp file and renaming it, at <step>
  partial     SIGKILL halfway through writing a checkpoint's temp file, at <step>
  sigterm     SIGTERM to itself during <step> (a scheduler's preemption notice)
  sigterm2    SIGTERM to itself twice during <step> (a scheduler, or a user, who insists)
  sigint      SIGINT to itself during <step> (Ctrl-C at a terminal)
  sigterm_batch  SIGTERM to itself at the start of micro-batch <step>, counted from 0 over the run's
              micro-batches (with accumulation k: micro-batch j of step s's window is s * k + j); under
              DDP on every rank, or only on <rank> where given
  sigterm_validation  SIGTERM to itself during the validation that follows <step>
  die         exit this rank abruptly at <step> (only on <rank>, default 1): a dead DDP worker
  die_late    as die, and the survivors sleep 12 s before their next collective (a loaded machine), so
              Lightning's child-process observer (it polls every 5 s) ends the job before gloo notices
  nan         make the training loss of <step> NaN (a bad step for the divergence guard), on every rank
              unless <rank> is given
"""

import os
import signal
import time

import lightning as L
import torch

import resnorm_lm.data.cache as atomic_files


def _kill(sig=signal.SIGKILL):
    os.kill(os.getpid(), sig)


class FaultProbe(L.Callback):
    def __init__(self) -> None:
        spec = os.environ.get("RESNORM_LM_FAULT", "")
        parts = spec.split(":")
        self.where, self.step = parts[0], int(parts[1]) if len(parts) > 1 else -1
        self.rank = int(parts[2]) if len(parts) > 2 else None  # None: every rank (die: rank 1)
        self.on_every_rank = self.rank is None

    def setup(self, trainer, pl_module, stage):
        if self.where in ("save", "partial"):
            self._patch_checkpoint_writes(trainer)

    def _patch_checkpoint_writes(self, trainer):
        """Checkpoints are written by ``torch.save`` into the file ``atomic_write`` renames into place."""
        probe = self
        real_replace, real_save = atomic_files.os.replace, torch.save

        class PatchedOS:
            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def replace(src, dst):
                if probe.where == "save" and str(dst).endswith(".ckpt") and trainer.global_step == probe.step:
                    _kill()
                return real_replace(src, dst)

        def save(obj, f):
            if probe.where == "partial" and trainer.global_step == probe.step:
                real_save(obj, f)
                f.truncate(f.tell() // 2)
                f.flush()
                _kill()
            return real_save(obj, f)

        atomic_files.os = PatchedOS()
        torch.save = save

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.where == "sigterm_batch" and batch_idx == self.step:
            if self.on_every_rank or trainer.global_rank == self.rank:
                _kill(signal.SIGTERM)
        model = pl_module.model
        if self.where == "nan" and trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            forward = type(model).forward
            model.forward = lambda idx, targets=None: (lambda out: (out[0], out[1] * float("nan")))(
                forward(model, idx, targets)
            )

    def on_train_batch_end(self, trainer, pl_module, *args):
        if "forward" in vars(pl_module.model):  # not in a validation that follows the step
            del pl_module.model.forward

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.where == "step" and trainer.global_step + 1 == self.step:
            _kill()
        if self.where in ("sigterm", "sigterm2", "sigint") and trainer.global_step + 1 == self.step:
            _kill(signal.SIGINT if self.where == "sigint" else signal.SIGTERM)
            if self.where == "sigterm2":
                _kill(signal.SIGTERM)
        dying_rank = 1 if self.rank is None else self.rank
        if self.where in ("die", "die_late") and trainer.global_step + 1 == self.step:
            if trainer.global_rank == dying_rank:
                os._exit(1)
            if self.where == "die_late":
                time.sleep(12)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.global_step == self.step and not trainer.sanity_checking and batch_idx == 0:
            if self.where == "validation":
                _kill()
            if self.where == "sigterm_validation":
                _kill(signal.SIGTERM)
