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
from torch.utils.data import DataLoader, TensorDataset

from resnorm_lm.device_verdicts import DeviceVerdicts
from resnorm_lm.diagnostics import grad_norms
from resnorm_lm.faults import DivergenceConfig, DivergenceGuard
from resnorm_lm.lightning_module import LanguageModel
from resnorm_lm.model import GPT, GPTConfig
from resnorm_lm.monitors import SparseThroughputMonitor
from resnorm_lm.optim import OptimConfig

NAN, INF = float("nan"), float("inf")
SEQUENCES = [
    [5.0, 4.0, 11.9, 12.5, 3.0],  # a spike above 3 x the running minimum (4.0) at step 3
    [5.0, NAN, 4.0, 4.5],
    [5.0, INF, NAN, 4.0, NAN, NAN, NAN, 3.0],  # skip mode: 3 in a row at step 6
    [5.0, 4.0, 3.0, 2.0],
]
CONFIGS = [
    DivergenceConfig(factor=3.0),
    DivergenceConfig(factor=0.0),
    DivergenceConfig(factor=3.0, on_bad_step="skip", max_skips=3),
    DivergenceConfig(factor=1.5, on_bad_step="skip", max_skips=2),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.on_bad_step}-x{c.factor:g}")
@pytest.mark.parametrize("losses", SEQUENCES, ids=range(len(SEQUENCES)))
def test_device_verdicts_reach_the_host_guards_decisions(config, losses):
    host = DivergenceGuard(config)
    expected_masks = []
    for step, loss in enumerate(losses):
        verdict = host.judge(loss, step)
        expected_masks.append(verdict != "ok")
        if verdict == "stop":
            break
    device = DivergenceGuard(config)
    verdicts = DeviceVerdicts(device)
    masks = []
    for step, loss in enumerate(losses[: len(expected_masks)]):
        verdicts.judge(torch.tensor(loss), step)
        masks.append(bool(verdicts.take_window()))
        verdicts.collect()
    assert masks == expected_masks
    assert device.diverged == host.diverged
    assert (device.skipped, device.skipped_in_a_row) == (host.skipped, host.skipped_in_a_row)
    assert device.running_min == host.running_min or math.isclose(device.running_min, host.running_min)


def test_a_halted_run_masks_every_later_step_until_the_host_reads_it():
    verdicts = DeviceVerdicts(DivergenceGuard(DivergenceConfig(factor=2.0)))
    windows = []
    for step, loss in enumerate([3.0, NAN, 3.0, 2.0]):  # the host reads only at the end
        verdicts.judge(torch.tensor(loss), step)
        windows.append(float(verdicts.take_window()))
    assert windows == [0.0, 1.0, 1.0, 1.0]
    assert verdicts.collect() and verdicts.guard.diverged == {"step": 1, "reason": "loss is nan"}


def test_the_window_of_an_accumulated_step_is_bad_when_any_micro_batch_is():
    verdicts = DeviceVerdicts(DivergenceGuard(DivergenceConfig(on_bad_step="skip")))
    for loss in (3.0, INF, 3.0):
        verdicts.judge(torch.tensor(loss), 0)
    assert float(verdicts.take_window()) == 1.0 and verdicts.take_window() is None


def test_resume_rebuilds_the_device_state_from_the_host_records():
    guard = DivergenceGuard(DivergenceConfig(factor=2.0))
    guard.load_state_dict({"running_min": 2.0, "skipped": 0, "skipped_in_a_row": 0, "diverged": None})
    verdicts = DeviceVerdicts(guard)
    verdicts.judge(torch.tensor(4.5), 10)  # above 2 x 2.0: bad against the loaded minimum
    assert float(verdicts.take_window()) == 1.0 and verdicts.collect()
    assert guard.diverged["step"] == 10 and "running minimum 2" in guard.diverged["reason"]


# ------------------------------------------------------------------ in a real Trainer


class PoisonedLoss(L.Callback):
    """Makes the loss of the training step at ``bad_steps`` NaN, and keeps the weights after every step."""

    def __init__(self, bad_steps: set[int]) -> None:
        self.bad_steps, self.weights = bad_steps, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        model, poison = pl_module.model, trainer.global_step in self.bad_steps
        forward = type(model).forward
        model.forward = lambda idx, targets=None: (lambda out: (out[0], out[1] * NAN if poison else out[1]))(
            forward(model, idx, targets)
        )

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.weights[trainer.global_step] = copy.deepcopy(pl_module.model.state_dict())


def fit(verdict: str, on_bad_step: str, bad_steps: set[int], max_steps: int = 6, **trainer_kwargs):
    torch.manual_seed(0)
    arch = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    module = LanguageModel(arch, OptimConfig(lr=1e-2, warmup_steps=0),
                           divergence=DivergenceConfig(on_bad_step=on_bad_step, verdict=verdict))  # fmt: skip
    tokens = torch.randint(0, 64, (max_steps * 4, 17))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)
    poison = PoisonedLoss(bad_steps)
    trainer_kwargs = {"logger": False, **trainer_kwargs}
    trainer_kwargs["callbacks"] = [poison, *trainer_kwargs.get("callbacks", [])]
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **trainer_kwargs)  # fmt: skip
    trainer.fit(module, data)
    return module, trainer, poison


@pytest.mark.parametrize("verdict", ["host", "device"])
def test_a_bad_step_is_never_applied_and_the_run_stops(verdict):
    module, trainer, poison = fit(verdict, "stop", bad_steps={3})
    assert (module.verdicts is not None) == (verdict == "device")
    assert module.guard.diverged["step"] == 3 and module.guard.diverged["reason"] == "loss is nan"
    last_good = poison.weights[3]  # after steps 0, 1, 2
    for name, tensor in module.model.state_dict().items():
        assert torch.equal(tensor, last_good[name]), name  # the poisoned step changed nothing
    optimizer = trainer.optimizers[0]
    assert all(int(optimizer.state[p]["step"]) == 3 for p in module.model.parameters())  # nor AdamW's state


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
    module = LanguageModel(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32),
                           divergence=DivergenceConfig(verdict="device"))  # fmt: skip
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
