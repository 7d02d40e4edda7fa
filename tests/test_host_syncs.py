"""No host sync at every step: divergence verdicts on the device, gradient norms in one read, throughput
timed on logging steps only.

The device verdicts run here on CPU tensors (the fused AdamW honours ``found_inf`` on the CPU as on
CUDA); only the asynchronous copy and its CUDA event are GPU-only.
"""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.train.callbacks import SparseThroughputMonitor
from resnorm_lm.train.diagnostics import grad_norms
from resnorm_lm.train.divergence import DivergenceConfig, DivergenceGuard, LossWindow
from resnorm_lm.train.lightning_module import LanguageModel
from resnorm_lm.train.optim import OptimConfig, build_optimizer

NAN, INF = float("nan"), float("inf")
SEQUENCES = [  # each step's loss, or the losses of its micro-batches (an accumulation window)
    [5.0, 4.0, 11.9, 12.5, 3.0],  # a spike above 3 x the running minimum (4.0) at step 3
    [5.0, NAN, 4.0, 4.5],
    [5.0, INF, NAN, 4.0, NAN, NAN, NAN, 3.0],  # skip mode: 3 in a row at step 6
    [5.0, 4.0, 3.0, 2.0],
    [(5.0, 4.0), (3.9, 12.5), (6.0, 3.5), (2.0, NAN), (NAN, NAN), (3.0, 2.5)],  # windows of 2 micro-batches
]
CONFIGS = [
    DivergenceConfig(factor=3.0),
    DivergenceConfig(factor=0.0),
    DivergenceConfig(factor=3.0, on_bad_step="skip", max_skips=3),
    DivergenceConfig(factor=1.5, on_bad_step="skip", max_skips=2),
]


def window_of(losses) -> torch.Tensor:
    """The ``LossWindow`` summary (3,) of a step's loss or micro-batch losses."""
    window = LossWindow()
    for loss in losses if isinstance(losses, tuple) else (losses,):
        window.add(torch.tensor(loss))
    return window.take()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.on_bad_step}-x{c.factor:g}")
@pytest.mark.parametrize("losses", SEQUENCES, ids=range(len(SEQUENCES)))
def test_the_device_mask_and_the_hosts_reading_reach_the_same_decisions(config, losses):
    """The one rule, applied both ways: read on the host at every step, or masked on the device and read later."""
    host = DivergenceGuard(config)
    expected_masks = []
    for step, loss in enumerate(losses):
        host.judge(window_of(loss), step)
        verdict = host.read()
        expected_masks.append(verdict != "ok")
        if verdict == "stop":
            break
    device = DivergenceGuard(config)
    masks = []
    for step, loss in enumerate(losses[: len(expected_masks)]):
        device.judge(window_of(loss), step)
        masks.append(bool(device.take_mask()))
    device.collect()  # the host reads every report at the end
    assert masks == expected_masks
    assert device.diverged == host.diverged
    assert (device.skipped, device.skipped_in_a_row) == (host.skipped, host.skipped_in_a_row)
    assert device.running_min == host.running_min or math.isclose(device.running_min, host.running_min)


def test_a_window_is_judged_on_its_worst_loss_and_lowers_the_minimum_to_its_best():
    guard = DivergenceGuard(DivergenceConfig(factor=3.0))
    guard.judge(window_of((5.0, 4.0)), 0)
    assert guard.read() == "ok" and guard.running_min == 4.0
    worst, best = LossWindow.extremes(window_of((2.0, NAN, 3.0)))
    assert math.isnan(worst) and float(best) == 2.0  # NaN is the worst loss, and no best one
    guard.judge(window_of((2.0, NAN, 3.0)), 1)
    assert guard.read() == "stop" and guard.diverged["reason"] == "loss is nan"
    assert guard.running_min == 4.0  # a bad window does not lower it


def test_a_halted_run_masks_every_later_step_until_the_host_reads_it():
    guard = DivergenceGuard(DivergenceConfig(factor=2.0))
    masks = []
    for step, loss in enumerate([3.0, NAN, 3.0, 2.0]):  # the host reads only at the end
        guard.judge(window_of(loss), step)
        masks.append(float(guard.take_mask()))
    assert masks == [0.0, 1.0, 1.0, 1.0]
    assert guard.collect() and guard.diverged == {"step": 1, "reason": "loss is nan"}


def test_the_window_of_an_accumulated_step_is_bad_when_any_micro_batch_is():
    guard = DivergenceGuard(DivergenceConfig(on_bad_step="skip"))
    guard.judge(window_of((3.0, INF, 3.0)), 0)
    assert float(guard.take_mask()) == 1.0 and guard.take_mask() is None
    guard.collect()
    assert guard.skipped == 1  # one skipped step, not one per micro-batch


def test_resume_rebuilds_the_device_state_from_the_host_records():
    guard = DivergenceGuard(DivergenceConfig(factor=2.0))
    guard.load_state_dict({"running_min": 2.0, "skipped": 0, "skipped_in_a_row": 0, "diverged": None})
    guard.judge(window_of(4.5), 10)  # above 2 x 2.0: bad against the loaded minimum
    assert float(guard.take_mask()) == 1.0 and guard.collect()
    assert guard.diverged["step"] == 10 and "running minimum 2" in guard.diverged["reason"]


# ------------------------------------------------------------------ in a real Trainer


class PoisonedLoss(L.Callback):
    """Multiplies the training loss by ``poison`` (NaN, or a spike) at the steps ``bad_steps`` (every micro-batch
    of each) and at the micro-batches ``bad_micro_batches`` (counted from 0 over the run); keeps the weights and
    AdamW's state after every step."""

    def __init__(self, bad_steps: set[int], bad_micro_batches: frozenset[int] = frozenset(), poison=NAN) -> None:
        self.bad_steps, self.bad_micro_batches, self.poison = bad_steps, bad_micro_batches, poison
        self.micro_batch, self.weights, self.optimizer_states = -1, {}, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.micro_batch += 1
        model = pl_module.model
        poison = trainer.global_step in self.bad_steps or self.micro_batch in self.bad_micro_batches
        forward = type(model).forward
        model.forward = lambda idx, targets=None: (lambda out: (out[0], out[1] * self.poison if poison else out[1]))(
            forward(model, idx, targets)
        )

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.weights[trainer.global_step] = copy.deepcopy(pl_module.model.state_dict())
        self.optimizer_states[trainer.global_step] = copy.deepcopy(trainer.optimizers[0].state_dict()["state"])


def fit(
    verdict: str,
    on_bad_step: str,
    bad_steps: set[int],
    max_steps: int = 6,
    bad_micro_batches=frozenset(),
    poison=NAN,
    **trainer_kwargs,
):
    torch.manual_seed(0)
    arch = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    module = LanguageModel(
        arch,
        OptimConfig(lr=1e-2, warmup_fraction=0.0),
        divergence=DivergenceConfig(on_bad_step=on_bad_step, verdict=verdict),
    )
    tokens = torch.randint(0, 64, (max_steps * trainer_kwargs.get("accumulate_grad_batches", 1) * 4, 17))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)
    poison = PoisonedLoss(bad_steps, bad_micro_batches, poison)
    trainer_kwargs = {"logger": False, **trainer_kwargs}
    trainer_kwargs["callbacks"] = [poison, *trainer_kwargs.get("callbacks", [])]
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_kwargs,
    )
    trainer.fit(module, data)
    return module, trainer, poison


def assert_same_state(a: dict, b: dict) -> None:
    """Two snapshots of weights or of AdamW's per-parameter state (moments and step count) are equal."""
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, dict):
            assert_same_state(value, b[key])
        else:
            assert torch.equal(value, b[key]), key


@pytest.mark.parametrize("verdict", ["host", "device"])
def test_a_bad_step_is_never_applied_and_the_run_stops(verdict):
    module, trainer, poison = fit(verdict, "stop", bad_steps={3})
    assert module.verdicts_on_device == (verdict == "device")
    assert module.guard.diverged["step"] == 3 and module.guard.diverged["reason"] == "loss is nan"
    last_good = poison.weights[3]  # after steps 0, 1, 2
    for name, tensor in module.model.state_dict().items():
        assert torch.equal(tensor, last_good[name]), name  # the poisoned step changed nothing
    optimizer = trainer.optimizers[0]
    assert all(int(optimizer.state[p]["step"]) == 3 for p in module.model.parameters())  # nor AdamW's state


def test_with_accumulation_host_and_device_verdicts_skip_the_same_whole_steps(monkeypatch):
    """A bad micro-batch makes its whole optimizer step a skipped step, counted once, in both verdict modes."""
    # the same (fused) AdamW in both modes: any difference between them is then the verdicts'
    monkeypatch.setattr(
        "resnorm_lm.train.lightning_module.build_optimizer",
        lambda *args, fused=None: build_optimizer(*args, fused=True),
    )
    runs = {
        verdict: fit(verdict, "skip", set(), max_steps=5, bad_micro_batches={2, 3, 7}, accumulate_grad_batches=2)
        for verdict in ("host", "device")
    }  # micro-batches 2 and 3 are step 1, micro-batch 7 is the second half of step 3
    for module, trainer, poison in runs.values():
        assert module.guard.skipped == 2 and module.guard.diverged is None and trainer.global_step == 5
        for bad in (1, 3):  # the state after the bad step is the state before it
            assert_same_state(poison.weights[bad + 1], poison.weights[bad])
            assert_same_state(poison.optimizer_states[bad + 1], poison.optimizer_states[bad])
        assert not torch.equal(poison.weights[3]["wte.weight"], poison.weights[2]["wte.weight"])  # good steps train
    (host, *_), (device, *_) = runs.values()
    assert_same_state(host.model.state_dict(), device.model.state_dict())
    assert host.guard.state_dict() == device.guard.state_dict()


def test_under_16_mixed_the_host_verdict_skips_a_whole_step_and_leaves_the_grad_scaler_alone():
    """The GradScaler owns the optimizer's skip flag: the host verdict drops a bad step's gradients instead, so a
    loss spike (finite gradients, which the scaler would apply) is skipped whole without touching the loss scale."""
    scaler = torch.amp.GradScaler("cpu")  # 16-mixed on CPU: Lightning would switch to bf16, so the plugin is given
    plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    module, trainer, poison = fit(
        "auto",
        "skip",
        set(),
        max_steps=5,
        bad_micro_batches={6},
        poison=10.0,
        accumulate_grad_batches=2,
        plugins=[plugin],
    )
    assert str(trainer.precision) == "16-mixed" and not module.verdicts_on_device  # auto: host verdicts under a scaler
    assert module.guard.skipped == 1 and trainer.global_step == 5
    assert_same_state(
        poison.weights[4], poison.weights[3]
    )  # step 3 (micro-batches 6, the bad one, and 7) applied nothing
    assert_same_state(poison.optimizer_states[4], poison.optimizer_states[3])
    assert scaler.get_scale() == 2.0**16  # the initial scale: no step was taken for an overflow


def test_device_skip_mode_masks_the_bad_step_and_trains_on():
    module, trainer, poison = fit("device", "skip", bad_steps={2}, max_steps=5)
    assert module.guard.diverged is None and module.guard.skipped == 1 and trainer.global_step == 5
    for name, tensor in poison.weights[3].items():  # the step at global step 2 was masked
        assert torch.equal(tensor, poison.weights[2][name]), name
    assert all(int(trainer.optimizers[0].state[p]["step"]) == 4 for p in module.model.parameters())


def test_bf16_mixed_with_the_fused_optimizer_clips_and_trains():
    """Lightning's mixed-precision plugin refuses to clip for a fused AdamW (seen on an H100, bf16-mixed:
    'does not allow for gradient clipping'); the module clips such an optimizer's gradients itself."""
    module, trainer, _ = fit("device", "stop", bad_steps=set(), precision="bf16-mixed", gradient_clip_val=0.05)
    assert trainer.global_step == 6 and trainer.optimizers[0].defaults["fused"]


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_the_module_clips_a_fused_optimizers_gradients(algorithm):
    module = LanguageModel(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32))
    module._trainer = type("T", (), {"precision": "bf16-mixed"})()
    params = list(module.parameters())
    optimizer = torch.optim.AdamW(params, fused=True)
    for p in params:
        p.grad = torch.full_like(p, 3.0)
    module.configure_gradient_clipping(optimizer, 0.5, algorithm)
    if algorithm == "norm":
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        assert total.item() == pytest.approx(0.5, rel=1e-4)
    else:
        assert all(torch.all(p.grad == 0.5) for p in params)


def test_device_verdicts_refuse_a_grad_scaler():
    module = LanguageModel(
        GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32),
        divergence=DivergenceConfig(verdict="device"),
    )
    module._trainer = type("T", (), {"precision": "16-mixed"})()
    with pytest.raises(ValueError, match="cannot be used with precision 16-mixed"):
        module._verdict_on_device(on_cuda=True)


def test_grad_norms_in_one_sync_match_the_per_tensor_norms():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32))
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    total, per_layer = grad_norms(model)
    expected_total = torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()
    expected = [torch.stack([p.grad.norm() for p in b.parameters() if p.ndim == 2]).norm() for b in model.blocks]
    assert total == pytest.approx(float(expected_total), rel=1e-5)
    assert per_layer == pytest.approx([float(e) for e in expected], rel=1e-5) and len(per_layer) == 3


class MetricsInMemory(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    name, version = "memory", 0

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.rows.append((step, dict(metrics)))


class CountedSyncs(SparseThroughputMonitor):
    """As on a GPU (where the parent synchronizes the device in ``_update``), counting those updates."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.updates = 0

    def syncs_device(self, trainer) -> bool:
        return True

    def _update(self, *args) -> None:
        self.updates += 1
        super()._update(*args)


def throughput_rows(monitor, max_steps: int = 12, every: int = 4) -> list[tuple[int, dict]]:
    logger = MetricsInMemory()
    fit("host", "stop", set(), max_steps=max_steps, callbacks=[monitor], logger=logger, log_every_n_steps=every)
    return [(step, m) for step, m in logger.rows if "train/samples" in m]


def test_throughput_is_timed_on_logging_steps_only_with_the_same_counts():
    sizes = {"batch_size_fn": lambda b: b[0].size(0), "length_fn": lambda b: b[0].numel(), "window_size": 2}
    every_step, sparse = ThroughputMonitor(**sizes), CountedSyncs(**sizes)
    dense_rows, sparse_rows = throughput_rows(every_step), throughput_rows(sparse)
    assert sparse.updates == 3  # steps 4, 8 and 12 of 12: one device sync per logging step
    counts = ("train/batches", "train/samples", "train/lengths")
    assert [(s, [m[k] for k in counts]) for s, m in sparse_rows] == [(s, [m[k] for k in counts]) for s, m in dense_rows]
    assert [m["train/samples"] for _, m in sparse_rows] == [16, 32, 48]  # 4 batches of 4 between logs
    rates = [m.get("train/device/samples_per_sec") for _, m in sparse_rows]
    assert rates[0] is None and all(r > 0 for r in rates[1:])  # over the window of the last 2 logging steps
