"""Callbacks the SLURM tests pass on the command line: one paces training and says how far it got, one sends
its own process a signal at a chosen micro-batch.

``PacedSteps`` makes a job's run last long enough for a test to signal it in the middle, at a step the test
has seen reached: after each training micro-batch it writes ``trainer.global_step`` to
``$RESNORM_LM_PROBE_DIR/step`` (rank 0) and sleeps ``$RESNORM_LM_STEP_SECONDS`` (default 0.25), time only.

``SignalAtMicroBatch`` stands in for SLURM where there is none: ``RESNORM_LM_SIGNAL_AT="USR1:<k>"`` sends
SIGUSR1 to its own process at the start of micro-batch k, counted from 0 over the process's run (unset or
empty: nothing).
"""

import os
import signal
import time
from pathlib import Path

import lightning as L


class PacedSteps(L.Callback):
    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.is_global_zero:
            Path(os.environ["RESNORM_LM_PROBE_DIR"], "step").write_text(str(trainer.global_step))
        time.sleep(float(os.environ.get("RESNORM_LM_STEP_SECONDS", "0.25")))


class SignalAtMicroBatch(L.Callback):
    def __init__(self) -> None:
        name, _, at = os.environ.get("RESNORM_LM_SIGNAL_AT", "").partition(":")
        self.signal = signal.Signals[f"SIG{name}"] if name else None
        self.at, self.seen = int(at or -1), 0

    def on_train_batch_start(self, trainer, *args) -> None:
        if self.signal is not None and self.seen == self.at:
            os.kill(os.getpid(), self.signal)
        self.seen += 1
