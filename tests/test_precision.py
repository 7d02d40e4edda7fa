"""precision: auto: measured on CPU, bf16 or fp16 on CUDA, explicit settings win, resumed runs keep theirs."""

from __future__ import annotations

import json
import math

import pytest
import torch

import resnorm_lm.precision as precision
from resnorm_lm.precision import PrecisionError, resolve_precision
from tests.train_helpers import run_cli, smoke_args, write_corpus


@pytest.fixture
def bf16_speedup(monkeypatch):
    """Pretend this CPU's bf16 matmul runs ``speedup`` x the speed of fp32."""

    def set_speedup(speedup: float) -> None:
        monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda size=precision.PROBE_SIZE: speedup)

    return set_speedup


def test_explicit_precisions_win_and_impossible_ones_are_refused_or_switched(capsys):
    assert resolve_precision("bf16-mixed", cuda=False).precision == "bf16-mixed"
    assert resolve_precision("32-true", cuda=False, resumed_with="bf16-mixed").precision == "32-true"
    assert resolve_precision("16-mixed", cuda=True).precision == "16-mixed"
    with pytest.raises(PrecisionError, match="16-true is refused on CPU: fp16 weights"):
        resolve_precision("16-true", cuda=False)
    assert resolve_precision("16-mixed", cuda=False).precision == "bf16-mixed"
    assert "switching to bf16-mixed on CPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    "speedup, expected, said",
    [(2.0, "bf16-mixed", "ran 2.00x as fast as fp32"), (1.05, "32-true", "ran 1.05x as fast as fp32"),
     (0.008, "32-true", "ran 125x slower than fp32")],
)  # fmt: skip
def test_auto_on_cpu_follows_the_measured_bf16_speed(bf16_speedup, speedup, expected, said):
    bf16_speedup(speedup)
    for requested in ("auto", None):
        choice = resolve_precision(requested, cuda=False)
        assert choice.precision == expected and said in choice.reason


def test_auto_on_cuda_is_bf16_where_supported_else_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", cuda=True).precision == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    choice = resolve_precision("auto", cuda=True)
    assert choice.precision == "16-mixed" and "has no bf16" in choice.reason
    resumed = resolve_precision("auto", cuda=True, resumed_with="bf16-mixed")
    assert resumed.precision == "16-mixed" and "does not support" in resumed.reason


def test_auto_keeps_a_resumed_runs_precision_or_says_why_not(bf16_speedup):
    bf16_speedup(0.01)  # bf16 slow here: a new run would use fp32
    kept = resolve_precision("auto", cuda=False, resumed_with="bf16-mixed")
    assert kept.precision == "bf16-mixed" and "kept from the checkpoint" in kept.reason
    moved = resolve_precision("auto", cuda=False, resumed_with="16-mixed")
    assert moved.precision == "32-true" and "started with 16-mixed, which needs a CUDA GPU" in moved.reason


def test_the_real_probe_measures_a_finite_ratio():
    precision.cpu_bf16_speedup.cache_clear()
    speedup = precision.cpu_bf16_speedup(64)
    assert math.isfinite(speedup) and speedup > 0


def test_a_run_says_what_it_chose_records_it_and_a_resume_keeps_it(tmp_path, capsys, bf16_speedup):
    corpus = write_corpus(tmp_path / "corpus")
    root = tmp_path / "runs"
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    bf16_speedup(3.0)  # as on a CPU with native bf16
    args = smoke_args(tmp_path, corpus, f"--run.root={root}", "--trainer.precision=auto", "--trainer.max_steps=4")
    assert run_cli([*args, "--run.stop_after_steps=2"]) == 0
    err = capsys.readouterr().err
    assert "resnorm-lm: precision bf16-mixed (a 256x256 bf16 matmul ran 3.00x as fast as fp32" in err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["precision"] == "bf16-mixed" and "3.00x as fast" in manifest["precision_reason"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["precision"] == "bf16-mixed"

    bf16_speedup(0.01)  # the run moved to a CPU without native bf16: the resumed run keeps bf16
    assert run_cli([*args, "--ckpt_path=last"]) == 0
    assert "precision bf16-mixed (kept from the checkpoint" in capsys.readouterr().err
    assert json.loads((run_dir / "manifest.json").read_text())["precision"] == "bf16-mixed"
