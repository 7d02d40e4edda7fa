"""SIGTERM under gradient accumulation: the run saves at an optimizer-step boundary, so RESUME=last is exact."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from resnorm_lm.train.checkpoint_io import AtomicCheckpointIO
from resnorm_lm.train.preemption import Preempted, Preemption
from tests.smoke import assert_same_training_state, resnorm_lm_process, run_cli, smoke_args, train_losses

STEPS = 3  # optimizer steps of every run
SIGNALLED_STEP = 1  # the SIGTERM lands in the window of this step (0-based): one step is done before it
CHECKPOINT_EVERY = SIGNALLED_STEP + 1  # a resumed run starts at a periodic checkpoint's step
BATCH, BLOCK = 4, 32  # the smoke profile's data.batch_size and data.block_size
# (accumulate_grad_batches, fault): a SIGTERM at every micro-batch of a window, and one during the validation
# pass that the smoke profile's val_check_interval (3 micro-batches) puts inside the window of step 1.
CASES = [
    *[
        pytest.param(k, f"sigterm_batch:{SIGNALLED_STEP * k + j}", id=f"accumulate{k}-micro{j}")
        for k, micro_batches in ((1, [0]), (2, range(2)), (8, range(8)))
        for j in micro_batches
    ],
    pytest.param(2, f"sigterm_validation:{SIGNALLED_STEP}", id="accumulate2-validation"),
]


def args(setting: dict, root: Path, accumulate: int, *extra: str) -> list[str]:
    return smoke_args(
        setting["corpus"],
        f"--run.root={root}",
        "--model.arch.n_layer=2",
        "--model.arch.dropout=0.1",
        f"--trainer.max_steps={STEPS}",
        f"--trainer.accumulate_grad_batches={accumulate}",
        f"--run.checkpoint_every={CHECKPOINT_EVERY}",
        *extra,
    )


def run_dir(root: Path) -> Path:
    return root / "prenorm-12l" / "smoke-seed1"


def last_checkpoint(root: Path) -> dict:
    return torch.load(run_dir(root) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A model this small trains fastest on one thread, the more so on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setting(tmp_path_factory, smoke_corpus) -> dict:
    return {"tmp": tmp_path_factory.mktemp("preempt-accumulation"), "corpus": smoke_corpus, "uninterrupted": {}}


@pytest.fixture
def written(monkeypatch) -> list[tuple[int, int]]:
    """``(global_step, micro-batches processed)`` of every last.ckpt the runs write."""
    seen = []
    save = AtomicCheckpointIO.save_checkpoint

    def recording_save(self, checkpoint, path, storage_options=None):
        if Path(path).name == "last.ckpt":
            progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]
            seen.append((checkpoint["global_step"], progress["processed"]))
        return save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", recording_save)
    return seen


def uninterrupted(setting: dict, accumulate: int) -> Path:
    """One uninterrupted run per accumulation, shared by the cases that compare with it."""
    if accumulate not in setting["uninterrupted"]:
        root = setting["tmp"] / f"uninterrupted-{accumulate}"
        assert run_cli(args(setting, root, accumulate)) == 0
        setting["uninterrupted"][accumulate] = root
    return setting["uninterrupted"][accumulate]


def tokens(root: Path) -> int:
    return json.loads((run_dir(root) / "eval.json").read_text())["tokens"]


@pytest.mark.parametrize("accumulate, fault", CASES)
def test_sigterm_anywhere_in_a_window_saves_at_its_end_and_resumes_bit_exact(
    setting, written, tmp_path, monkeypatch, accumulate, fault
):
    reference = uninterrupted(setting, accumulate)
    root = tmp_path / "runs"
    monkeypatch.setenv("RESNORM_LM_FAULT", fault)
    assert run_cli(args(setting, root, accumulate, "--trainer.callbacks+=tests.fault_probe.FaultProbe")) == 143
    # the window the signal landed in was finished before saving: the checkpoint is at a step boundary
    saved = SIGNALLED_STEP + 1
    assert last_checkpoint(root)["global_step"] == saved
    assert tokens(root) == saved * accumulate * BATCH * BLOCK  # what the saved weights were trained on
    monkeypatch.delenv("RESNORM_LM_FAULT")
    assert run_cli(args(setting, root, accumulate, "--ckpt_path=last")) == 0
    assert_same_training_state(last_checkpoint(reference), last_checkpoint(root))
    assert train_losses(run_dir(root)) == train_losses(run_dir(reference))  # the same batches, step by step
    assert tokens(root) == tokens(reference) == STEPS * accumulate * BATCH * BLOCK
    # every last.ckpt written, the periodic ones after the resume included, holds no partial window
    assert written and all(processed == step * accumulate for step, processed in written), written


class Rank:
    """One DDP rank's Preemption driven through micro-batches as Lightning's loop drives it."""

    def __init__(self, tmp_path: Path, accumulate: int, signalled_at: int | None, others_signalled_at: int | None):
        self.preempt = Preemption(tmp_path / "last.ckpt", ddp_check_every=2)
        self.accumulate, self.signalled_at, self.others_signalled_at = accumulate, signalled_at, others_signalled_at
        self.micro_batch, self.collectives, self.saved = 0, [], []
        self.global_step, self.world_size, self.is_global_zero, self.strategy = 0, 2, False, self

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # the collective: any rank's flag
        self.collectives.append(self.micro_batch)
        return decision or (self.others_signalled_at is not None and self.micro_batch >= self.others_signalled_at)

    def save_checkpoint(self, path: Path, weights_only: bool | None = None) -> None:  # Lightning's signature
        assert weights_only is False, "a preemption checkpoint must hold the optimizer and loops to resume"
        self.saved.append((self.micro_batch, self.global_step))

    def run(self, micro_batches: int) -> None:
        with pytest.raises(Preempted):
            for self.micro_batch in range(micro_batches):
                self.preempt.on_train_batch_start(self)
                self.preempt.requested |= self.micro_batch == self.signalled_at
                if (self.micro_batch + 1) % self.accumulate == 0:  # the window's last micro-batch steps
                    self.global_step += 1
                self.preempt.on_train_batch_end(self)


def test_under_ddp_with_accumulation_the_ranks_compare_flags_at_the_same_step_ends(tmp_path):
    """The collective happens only at the end of an optimizer step whose count is a multiple of
    ddp_check_every, on every rank alike, whatever its own flag; all ranks save at the same window end."""
    accumulate = 4
    signalled = Rank(tmp_path, accumulate, signalled_at=8, others_signalled_at=None)  # micro-batch 0 of step 2
    other = Rank(tmp_path, accumulate, signalled_at=None, others_signalled_at=8)
    for rank in (signalled, other):
        rank.run(micro_batches=40)
        # steps 2 and 4 end at micro-batches 7 and 15; the flag raised at 8 is seen at 15, the end of step 4
        assert rank.collectives == [7, 15]
        assert rank.saved == [(15, 4)] and rank.preempt.saved_at_step == 4


def fit_ddp(setting: dict, root: Path, *extra: str, fault: str = "") -> subprocess.CompletedProcess:
    """2 gloo ranks, accumulation 2, 22 steps: the ranks compare flags at steps 10 and 20 (ddp_check_every)."""
    argv = smoke_args(
        setting["corpus"],
        f"--run.root={root}",
        "--model.arch.n_layer=2",
        "--model.arch.dropout=0.1",
        "--trainer.max_steps=22",
        "--trainer.accumulate_grad_batches=2",
        "--run.checkpoint_every=10",
        "--trainer.val_check_interval=1000",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        *extra,
    )
    if fault:
        argv.append("--trainer.callbacks+=tests.fault_probe.FaultProbe")
    return resnorm_lm_process(argv, timeout=600, RESNORM_LM_FAULT=fault, OMP_NUM_THREADS="1")


@pytest.mark.slow
def test_under_ddp_a_sigterm_on_one_rank_mid_window_saves_at_a_shared_step_end_and_resumes_bit_exact(setting):
    reference, root = setting["tmp"] / "ddp-uninterrupted", setting["tmp"] / "ddp-preempted"
    assert fit_ddp(setting, reference).returncode == 0
    # micro-batch 20 opens the window of step 10, a step whose end the ranks checked before (and saved in the
    # middle of); now the flag waits for the next checked step end, step 20
    stopped = fit_ddp(setting, root, fault="sigterm_batch:20:1")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    checkpoint = last_checkpoint(root)
    processed = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"]
    assert (checkpoint["global_step"], processed) == (20, 40)
    resumed = fit_ddp(setting, root, "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training_state(last_checkpoint(reference), last_checkpoint(root))
    assert tokens(root) == tokens(reference) == 22 * 2 * BATCH * BLOCK * 2
