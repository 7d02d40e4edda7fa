"""The arithmetic a run records: its fingerprint (the same twice, changed by a number that changes, blind to
names, harmless to the run's own random streams), the portable environment, and the kernels it fixes."""

from __future__ import annotations

import json

import pytest
import torch

from resnorm_lm.model.gpt import GPTConfig
from resnorm_lm.train.arithmetic import PORTABLE_ENV, describe, fingerprint, is_portable, probe_digest
from resnorm_lm.train.precision import PrecisionError, tf32_wanted

ARCH = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
CPU = torch.device("cpu")


def test_a_fingerprint_is_the_same_twice_and_changes_with_the_numbers():
    first = fingerprint(ARCH, 4, CPU, "32-true")
    assert first == fingerprint(ARCH, 4, CPU, "32-true") and first["version"] >= 1
    other = fingerprint(GPTConfig(**{**vars(ARCH), "placement": "postnorm"}), 4, CPU, "32-true")
    assert other["model"] != first["model"]  # another recipe, other numbers
    assert other["reference"] == first["reference"]  # the reference model does not depend on the recipe
    assert probe_digest(ARCH, 4, CPU, "bf16-mixed") != first["model"]  # another precision, other numbers


def test_a_fingerprint_does_not_depend_on_the_parameters_names(monkeypatch):
    from resnorm_lm.model import gpt

    plain = probe_digest(ARCH, 4, CPU, "32-true")
    reversed_order = gpt.GPT.parameters

    def parameters(self, recurse=True):  # the same tensors, in another order (as a rename or a reordering gives)
        return iter(reversed(list(reversed_order(self, recurse))))

    monkeypatch.setattr(gpt.GPT, "parameters", parameters)
    assert probe_digest(ARCH, 4, CPU, "32-true") == plain


def test_measuring_the_fingerprint_leaves_the_runs_random_streams_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    fingerprint(ARCH, 2, CPU, "32-true")
    assert torch.equal(torch.rand(3), expected)


def test_the_portable_environment_and_what_a_run_records_of_it(monkeypatch):
    for name in PORTABLE_ENV:
        monkeypatch.delenv(name, raising=False)
    record = describe(CPU, "32-true")
    assert record["env"] == {} and record["portable"] is False and record["device"] == "cpu"
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    for name, value in PORTABLE_ENV.items():
        monkeypatch.setenv(name, value)
    record = describe(CPU, "32-true")
    assert record["portable"] and is_portable(record["env"]) and json.dumps(record)  # a manifest holds it
    assert PORTABLE_ENV["OMP_NUM_THREADS"] == "1" and PORTABLE_ENV["ATEN_CPU_CAPABILITY"] == "avx2"


def test_tf32_and_the_attention_kernel_are_set_by_name(monkeypatch):
    from resnorm_lm.train.cpu_attention import use_for_run

    monkeypatch.setenv("RESNORM_LM_TF32", "off")
    assert tf32_wanted() is False
    monkeypatch.setenv("RESNORM_LM_TF32", "maybe")
    with pytest.raises(PrecisionError, match="RESNORM_LM_TF32='maybe': on .* or off"):
        tf32_wanted()
    monkeypatch.setenv("RESNORM_LM_CPU_ATTENTION", "math")
    assert "SDPA's math backend (set by RESNORM_LM_CPU_ATTENTION, not measured)" in use_for_run("32-true", 4, 2, 16, 32)
    monkeypatch.setenv("RESNORM_LM_CPU_ATTENTION", "fastest")
    with pytest.raises(ValueError, match="RESNORM_LM_CPU_ATTENTION='fastest': one of flash, math"):
        use_for_run("32-true", 4, 2, 16, 32)


def test_a_smoke_run_records_its_arithmetic_and_its_seeds(recipe_run):
    manifest = json.loads((recipe_run("prenorm-12l") / "manifest.json").read_text())
    record = manifest["arithmetic"]
    assert set(record["fingerprint"]) == {"version", "reference", "model"} and record["precision"] == "32-true"
    assert manifest["segments"][-1]["arithmetic"] == record
    assert manifest["seeds"] == {"init": 1, "data_order": 1}  # seed 1 sets both


def test_the_command_prints_each_recipes_model_fingerprint_as_a_run_records_it(capsys):
    from resnorm_lm.train.arithmetic import main
    from resnorm_lm.train.recipes import recipe_arch

    assert main(["--profile", "smoke", "--recipes", "prenorm-12l", "postnorm-12l", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cpu = torch.device("cpu")
    for recipe in ("prenorm-12l", "postnorm-12l"):  # what a run of the recipe at the smoke profile records
        assert printed["models"][recipe] == fingerprint(recipe_arch(recipe, "smoke"), 4, cpu, "32-true")["model"]
    assert printed["models"]["prenorm-12l"] != printed["models"]["postnorm-12l"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_the_command_refuses_the_gpu_where_there_is_none(capsys):
    from resnorm_lm.train.arithmetic import main

    with pytest.raises(SystemExit):
        main(["--profile", "smoke", "--device", "cuda", "--json"])
    assert "--device cuda: this machine has no CUDA GPU" in capsys.readouterr().err
