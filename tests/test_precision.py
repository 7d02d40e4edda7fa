"""precision: auto: gated by the CPU's native bf16, then probed once per machine and kept; bf16 or fp16 on CUDA;
explicit settings win; resumed runs keep theirs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import resnorm_lm.train.precision as precision
from resnorm_lm.train.precision import Bf16Probe, PrecisionError, choose_auto, resolve_precision
from tests.smoke import run_cli, smoke_args

REPO = Path(__file__).resolve().parents[1]
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def cpu(monkeypatch, cache):
    """The real gate and cache on a pretend x86 CPU: its flags and torch's capability as given (AVX512_BF16
    by default), and a probe that finds bf16 ``speedup`` x as fast as fp32. Returns the speedups measured."""
    measured: list[float] = []
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # `make test-avx2` sets it; tests set it themselves
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)

    def pretend(speedup: float, flags: tuple[str, ...] = ("avx512_f", "avx512_bf16"), capability: str = "AVX512"):
        features = {"architecture": "x86_64", "cpu_name": "Some CPU", **dict.fromkeys(flags, True)}
        monkeypatch.setattr(precision, "cpu_features", lambda: features)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)

        def measure(pairs: int = precision.PROBE_PAIRS) -> Bf16Probe:
            measured.append(speedup)
            return Bf16Probe(speedup, fp32_ms=10.0, bf16_ms=10.0 / speedup, pairs=pairs, measured="2026-01-01 00:00")

        monkeypatch.setattr(precision, "measure_cpu_bf16", measure)
        return measured

    return pretend


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
    [
        (2.0, "bf16-mixed", "ran 2.00x as fast as fp32"),
        (1.4, "32-true", "ran 1.40x as fast as fp32 under bf16 autocast"),
        (0.008, "32-true", "ran 125.0x slower than fp32"),
    ],
)
def test_auto_on_a_bf16_cpu_follows_the_probe_with_a_margin(cpu, speedup, expected, said):
    cpu(speedup)
    for requested in ("auto", None):
        choice = resolve_precision(requested, cuda=False)
        assert choice.precision == expected and said in choice.reason
        assert ("less than the 1.5x that bf16 must gain" in choice.reason) == (expected == "32-true")


def test_auto_on_cuda_is_bf16_where_supported_else_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", cuda=True).precision == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    choice = resolve_precision("auto", cuda=True)
    assert choice.precision == "16-mixed" and "has no bf16" in choice.reason
    resumed = resolve_precision("auto", cuda=True, resumed_with="bf16-mixed")
    assert resumed.precision == "16-mixed" and "does not support" in resumed.reason


def test_auto_keeps_a_resumed_runs_precision_or_says_why_not(cpu):
    cpu(0.01)  # bf16 slow here: a new run would use fp32
    kept = resolve_precision("auto", cuda=False, resumed_with="bf16-mixed")
    assert kept.precision == "bf16-mixed" and "kept from the checkpoint" in kept.reason
    moved = resolve_precision("auto", cuda=False, resumed_with="16-mixed")
    assert moved.precision == "32-true" and "started with 16-mixed, which needs a CUDA GPU" in moved.reason


@pytest.mark.parametrize(
    "flags, capability, env, said",
    [
        (("avx2", "avx512_f"), "AVX512", {}, "Some CPU lacks avx512_bf16 and amx_bf16: bf16 would be emulated"),
        (("avx512_bf16",), "AVX2", {}, "torch's CPU capability is AVX2 here (ATEN_CPU_CAPABILITY)"),
        (("avx512_bf16",), "DEFAULT", {}, "torch's CPU capability is DEFAULT"),
        (("amx_bf16",), "AVX512", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN below"),
        (("avx512_bf16",), "AVX512", {"DNNL_MAX_CPU_ISA": "avx512_core"}, "DNNL_MAX_CPU_ISA=avx512_core caps"),
    ],
)
def test_a_cpu_without_native_bf16_never_gets_bf16_whatever_a_timing_says(
    monkeypatch, cpu, flags, capability, env, said
):
    measured = cpu(50.0, flags=flags, capability=capability)  # a timing that says bf16 is very fast
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for measure in (False, True):
        choice = choose_auto(cuda=False, measure=measure)
        assert choice.precision == "32-true" and said in choice.reason
    assert measured == []  # the gate decides: no probe runs

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    cpu(50.0, flags=("avx512_bf16",), capability="AVX512")  # the same timing where the CPU has it: bf16
    assert choose_auto(cuda=False).precision == "bf16-mixed"


@pytest.mark.training
def test_the_gate_respects_the_avx2_caps_of_make_test_avx2_whatever_proc_cpuinfo_lists(tmp_path):
    """The real gate in a process started as `make test-avx2` starts pytest: never bf16 there."""
    env = {**os.environ, **AVX2_ONLY, "PYTHONPATH": str(REPO), "RESNORM_LM_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "resnorm_lm.train.precision"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "resnorm-lm: precision 32-true (" in proc.stdout
    assert not (tmp_path / "precision").exists()  # decided by the gate, nothing measured or kept


def test_the_probe_is_kept_per_machine_and_measured_again_for_another_torch(monkeypatch, cpu, cache):
    measured = cpu(2.0)
    first = choose_auto(cuda=False)
    kept = next((cache / "precision").glob("cpu-bf16-*.json"))
    assert first.precision == "bf16-mixed" and f"measured now, kept in {kept}" in first.reason
    assert json.loads(kept.read_text())["machine"]["torch"] == torch.__version__

    cpu(1.0)  # a probe now would say otherwise; every run on this machine keeps the first answer
    again = choose_auto(cuda=False)
    assert again.precision == "bf16-mixed" and f"read from {kept}" in again.reason and "--measure" in again.reason
    assert measured == [2.0]

    original = torch.__version__
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # another torch: its kernels may differ, so measure again
    other = choose_auto(cuda=False)
    assert other.precision == "32-true" and "measured now" in other.reason and measured == [2.0, 1.0]
    monkeypatch.setattr(torch, "__version__", original)
    assert f"read from {kept}" in choose_auto(cuda=False).reason and measured == [2.0, 1.0]
    assert "measured now" in choose_auto(cuda=False, measure=True).reason and measured == [2.0, 1.0, 1.0]
    monkeypatch.setattr(os, "cpu_count", lambda: 96)  # another machine with the same CPU model
    assert "measured now" in choose_auto(cuda=False).reason and measured == [2.0, 1.0, 1.0, 1.0]
    assert len(list((cache / "precision").glob("cpu-bf16-*.json"))) == 3


def test_a_kept_probe_that_is_unreadable_or_for_another_machine_is_measured_again(cpu, cache):
    measured = cpu(2.0)
    choose_auto(cuda=False)
    kept = next((cache / "precision").glob("cpu-bf16-*.json"))
    for spoiled in ("{not json", json.dumps({"machine": {"cpu": "another"}, "probe": {"speedup": 9.0}}), "[]"):
        kept.write_text(spoiled)
        assert "measured now" in choose_auto(cuda=False).reason
    assert measured == [2.0] * 4 and json.loads(kept.read_text())["probe"]["speedup"] == 2.0


def test_a_cache_that_cannot_be_written_measures_in_every_run_and_says_so(monkeypatch, cpu, tmp_path):
    measured = cpu(2.0)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "a-file" / "cache"))
    for _ in range(2):
        choice = choose_auto(cuda=False)
        assert choice.precision == "bf16-mixed" and "measured now, not kept: " in choice.reason
    assert measured == [2.0, 2.0]


def test_the_cli_says_the_choice_and_measures_again_on_request(cpu, capsys):
    measured = cpu(2.0)
    assert precision.main([]) == 0 and precision.main([]) == 0 and precision.main(["--measure"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.startswith("resnorm-lm: precision bf16-mixed (") for line in out] == [True] * 3
    assert ["measured now" in out[0], "read from" in out[1], "measured now" in out[2]] == [True] * 3
    assert measured == [2.0, 2.0]


def test_the_probe_has_the_cpu_profiles_shapes():
    profile = yaml.safe_load((REPO / "recipes" / "profiles" / "cpu.yaml").read_text())
    rows, width = profile["data"]["batch_size"] * profile["data"]["block_size"], profile["model"]["arch"]["n_embd"]
    assert (precision.PROBE_ROWS, precision.PROBE_WIDTH, precision.PROBE_HIDDEN) == (rows, width, 4 * width)


def test_the_real_probe_measures_a_finite_ratio_and_restores_the_thread_count():
    threads = torch.get_num_threads()  # 1 in the tests (conftest): a count the probe does not use itself
    torch.set_num_threads(3)
    try:
        probe = precision.measure_cpu_bf16(pairs=1)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(probe.speedup) and probe.speedup > 0 and probe.fp32_ms > 0 and probe.bf16_ms > 0


def test_the_real_probe_leaves_the_runs_rng_stream_untouched():
    """A fit measures after seeding and before building its model: the first run on a machine (measured)
    and the next (read from the cache) must start from the same weights."""
    torch.manual_seed(1)
    before = torch.get_rng_state()
    precision.measure_cpu_bf16(pairs=1)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.training
def test_the_decision_is_the_same_in_20_real_probes_while_another_job_loads_every_core(cache):
    """Real probes while a busy process computes on every core. Where the gate decides (a CPU without native bf16,
    or `make test-avx2`'s caps) no probe runs, and 20 answers of the gate would measure nothing: skipped there."""
    gate = precision.missing_native_bf16()
    if gate is not None:
        pytest.skip(f"the gate decides without a probe: {gate}")
    busy = "import torch; a = torch.randn(256, 256); print('busy', flush=True)\nwhile True: a @ a"
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())}
    job = subprocess.Popen([sys.executable, "-c", busy], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "busy"
        choices = [choose_auto(cuda=False, measure=True) for _ in range(20)]
        assert job.poll() is None  # the load lasted the whole test
    finally:
        job.kill()
        job.wait()
    decisions = {choice.precision for choice in choices}
    assert len(decisions) == 1, "\n".join(choice.reason for choice in choices)


@pytest.mark.training
def test_a_seeds_first_run_on_a_machine_measures_and_matches_its_repeat_that_reads(
    tmp_path, capsys, monkeypatch, cache, smoke_corpus, data_cache
):
    """The real probes (precision, attention) run after the seed is set and before the model is built: the
    run that measures them and the run that reads them from the cache must train the same weights."""
    features = {"architecture": "x86_64", "cpu_name": "Some CPU", "avx512_f": True, "avx512_bf16": True}
    monkeypatch.setattr(precision, "cpu_features", lambda: features)  # the gate lets the real probe run
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("RESNORM_LM_CPU_ATTENTION", raising=False)  # measured, not named
    weights = []
    for name, source in (("first", "measured now"), ("repeat", "read from")):
        root = tmp_path / name
        args = smoke_args(smoke_corpus, f"--run.root={root}", "--trainer.precision=auto", cache_dir=data_cache)
        assert run_cli([*args, "--trainer.max_steps=2"]) == 0
        err = capsys.readouterr().err
        assert err.count(source) == 2, err  # the precision line and the attention line
        ckpt = torch.load(root / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt", weights_only=True)
        weights.append(ckpt["state_dict"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_run_says_what_it_chose_records_it_and_a_resume_keeps_it(tmp_path, capsys, cpu, smoke_corpus, data_cache):
    root = tmp_path / "runs"
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    cpu(3.0)  # as on a CPU with native bf16
    args = smoke_args(
        smoke_corpus, f"--run.root={root}", "--trainer.precision=auto", "--trainer.max_steps=4", cache_dir=data_cache
    )  # the session's prepared data; the precision probe in this test's cache
    assert run_cli([*args, "--run.stop_after_steps=2"]) == 0
    err = capsys.readouterr().err
    assert "resnorm-lm: precision bf16-mixed (the forward and backward of a 128->512->128 MLP" in err
    assert "ran 3.00x as fast as fp32" in err and "measured now, kept in" in err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["precision"] == "bf16-mixed" and "3.00x as fast" in manifest["precision_reason"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["precision"] == "bf16-mixed"

    cpu(3.0, flags=("avx2",))  # the run moved to a CPU without native bf16: the resumed run keeps bf16
    assert run_cli([*args, "--ckpt_path=last"]) == 0
    assert "precision bf16-mixed (kept from the checkpoint" in capsys.readouterr().err
    assert json.loads((run_dir / "manifest.json").read_text())["precision"] == "bf16-mixed"
