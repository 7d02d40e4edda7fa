"""What resnorm-lm takes from Lightning beyond its public API, checked against the installed Lightning.

Where Lightning has a public way, the code computes from it and is checked here against Lightning's own private
rule, micro-batch by micro-batch (``ends_optimizer_step``, ``logs_this_step``); where it has none, the code uses
the private attribute and is checked here to still find it (the throughput monitor's counts). Either way an
upgrade that moves one fails here, naming the attribute and the Lightning version, not in the middle of a run.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.trainer.states import RunningStage
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from resnorm_lm.train.callbacks import SparseThroughputMonitor, ends_optimizer_step, logs_this_step

VERSION = L.__version__
BATCHES, BATCH = 7, 2  # 7 micro-batches an epoch: windows of 3 leave a last window of 1


def moved(what: str, used_by: str) -> str:
    return (
        f"lightning {VERSION}: {what} moved or changed meaning; {used_by} relies on it. Update it, or pin "
        "lightning to the range it was tested with"
    )


def private(obj, name: str, what: str, used_by: str):
    """``obj.name``, or a failure that says which private Lightning attribute is gone."""
    assert hasattr(obj, name), moved(what, used_by)
    return getattr(obj, name)


class Unsized(IterableDataset):
    """Batches without a length: Lightning learns where the epoch ends only by fetching one batch ahead."""

    def __iter__(self):
        return iter([(torch.randn(BATCH, 4),) for _ in range(BATCHES)])


class Recorder(L.LightningModule):
    """A linear model that records, at each micro-batch, the public rule's answer beside Lightning's own."""

    flops_per_batch = None  # what ThroughputMonitor asks of a module (not measured here)

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.stop_at = stop_at  # the optimizer step after which the module stops the run
        self.layer = torch.nn.Linear(4, 1)
        self.steps: list[tuple[int, int, bool, bool]] = []  # (epoch, batch_idx, public rule, Lightning's rule)
        self.logs: list[tuple[int, bool, bool]] = []  # (global step, public rule, Lightning's rule)

    def training_step(self, batch, batch_idx):
        loop = self.trainer.fit_loop
        should_accumulate = private(
            loop,
            "_should_accumulate",
            "trainer.fit_loop._should_accumulate()",
            "resnorm_lm/train/callbacks.py (checked against it)",
        )
        ours = ends_optimizer_step(self.trainer, batch_idx)
        self.steps.append((self.current_epoch, batch_idx, ours, not should_accumulate()))
        if ours and self.trainer.global_step + 1 == self.stop_at:
            self.trainer.should_stop = True
        return self.layer(batch[0]).pow(2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if ends_optimizer_step(self.trainer, batch_idx):
            connector = private(
                self.trainer,
                "_logger_connector",
                "trainer._logger_connector",
                "resnorm_lm/train/callbacks.py (checked against it)",
            )
            self.logs.append((self.trainer.global_step, logs_this_step(self.trainer), connector.should_update_logs))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(module: L.LightningModule, loader, accumulate: int, callbacks=(), max_epochs: int = 2) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        accumulate_grad_batches=accumulate,
        log_every_n_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(module, loader)
    return trainer


@pytest.mark.parametrize("sized", [True, False], ids=["sized", "unsized"])
@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_step_boundary_and_logging_rules_agree_with_lightnings_own_on_every_micro_batch(sized, accumulate):
    loader = DataLoader(TensorDataset(torch.randn(BATCHES * BATCH, 4)), batch_size=BATCH) if sized else Unsized()
    module = Recorder()
    trainer = fit(module, loader, accumulate)
    assert len(module.steps) == 2 * BATCHES  # two epochs, every micro-batch seen
    disagree = [(epoch, i, ours, theirs) for epoch, i, ours, theirs in module.steps if ours != theirs]
    assert not disagree, moved(
        "the rule for when the optimizer steps (fit_loop._should_accumulate)",
        f"resnorm_lm/train/callbacks.py, which disagrees at {disagree}",
    )
    assert sum(theirs for *_, theirs in module.steps) == trainer.global_step == 2 * -(-BATCHES // accumulate)
    wrong_logs = [row for row in module.logs if row[1] != row[2]]
    assert not wrong_logs, moved(
        "when training metrics are logged (_logger_connector.should_update_logs)",
        f"resnorm_lm/train/callbacks.py, which disagrees at {wrong_logs}",
    )
    assert any(ours for _, ours, _ in module.logs)


def test_the_step_a_run_stops_at_is_logged_as_lightning_logs_it():
    module = Recorder(stop_at=3)  # log_every_n_steps=2: step 3 is logged only because the run stops there
    fit(module, DataLoader(TensorDataset(torch.randn(BATCHES * BATCH, 4)), batch_size=BATCH), accumulate=1)
    what = "logging at the step a run stops (should_update_logs)"
    assert module.logs[-1] == (3, True, True), moved(what, f"resnorm_lm/train/callbacks.py, which logs {module.logs}")


def test_the_throughput_monitor_still_keeps_the_counts_the_sparse_monitor_adds_to():
    """``SparseThroughputMonitor`` counts a batch between logging steps into the parent's private dicts."""
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), length_fn=lambda batch: batch[0].numel())
    loader = DataLoader(TensorDataset(torch.randn(BATCHES * BATCH, 4)), batch_size=BATCH)
    fit(Recorder(), loader, accumulate=1, callbacks=[monitor], max_epochs=1)
    for name, per_batch in (("_samples", BATCH), ("_batches", 1), ("_lengths", BATCH * 4)):
        counts = private(monitor, name, f"ThroughputMonitor.{name}", "resnorm_lm/train/callbacks.py")
        assert counts.get(RunningStage.TRAINING) == BATCHES * per_batch, moved(
            f"ThroughputMonitor.{name} (a count per stage)", "resnorm_lm/train/callbacks.py"
        )
    # the sparse monitor, on its path of a device that it syncs only on logging steps (made to think it is on
    # one), counts the same samples, batches and lengths into those dicts
    sparse = SparseThroughputMonitor(batch_size_fn=lambda b: b[0].size(0), length_fn=lambda b: b[0].numel())
    sparse.syncs_device = lambda trainer: True
    fit(Recorder(), loader, accumulate=1, callbacks=[sparse], max_epochs=1)
    for name, per_batch in (("_samples", BATCH), ("_batches", 1), ("_lengths", BATCH * 4)):
        assert getattr(sparse, name).get(RunningStage.TRAINING) == BATCHES * per_batch, name
