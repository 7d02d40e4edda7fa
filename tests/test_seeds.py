"""Seed k sets the init and the data order, the same data order for every recipe; ``model.init_seed`` and
``data.seed`` fix one of them apart, and the run directory says so."""

from __future__ import annotations

import json

import torch
import yaml

from resnorm_lm.model.gpt import GPTConfig
from resnorm_lm.train.lightning_module import LanguageModel
from resnorm_lm.train.runs import RunConfig, run_directory
from tests.smoke import run_cli_captured, smoke_args

ARCH = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def weights(module: LanguageModel) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.model.parameters()]


def test_the_init_follows_the_runs_seed_unless_given_its_own():
    torch.manual_seed(1)
    by_seed_1 = weights(LanguageModel(ARCH))
    torch.manual_seed(2)
    by_seed_2 = weights(LanguageModel(ARCH))
    torch.manual_seed(2)
    fixed = LanguageModel(ARCH, init_seed=1)
    after_fixed_init = torch.rand(1)
    torch.manual_seed(2)
    assert torch.equal(torch.rand(1), after_fixed_init)  # the run's own stream: untouched by a fixed init
    assert not all(torch.equal(a, b) for a, b in zip(by_seed_1, by_seed_2))
    assert all(torch.equal(a, b) for a, b in zip(by_seed_1, weights(fixed)))


def test_the_run_directory_names_a_seed_fixed_apart_from_the_run_seed():
    run = RunConfig(recipe="r", profile="cpu", root="runs", tag="lr0.001-wf0.25")
    assert run_directory(run, 3).name == "cpu-lr0.001-wf0.25-seed3"
    assert run_directory(run, 3, data_seed=3, init_seed=3).name == "cpu-lr0.001-wf0.25-seed3"  # the same thing
    assert run_directory(run, 3, data_seed=1).name == "cpu-lr0.001-wf0.25-seed3-data1"
    assert run_directory(run, 3, init_seed=1).name == "cpu-lr0.001-wf0.25-seed3-init1"


def test_a_runs_data_order_is_its_seeds_for_every_recipe_and_can_be_fixed(tmp_path, smoke_corpus):
    seen = {}
    for recipe, extra in (("prenorm-12l", []), ("postnorm-12l", []), ("prenorm-12l", ["--data.seed=1"])):
        done = run_cli_captured(
            smoke_args(
                smoke_corpus,
                f"--run.root={tmp_path}",
                "--trainer.max_steps=1",
                "--trainer.val_check_interval=1",
                "--seed_everything=3",
                *extra,
                recipe=recipe,
            )
        )
        assert done.returncode == 0, done.stderr[-2000:]
        name = "smoke-seed3" + ("-data1" if extra else "")
        run_dir = tmp_path / recipe / name
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        manifest = json.loads((run_dir / "manifest.json").read_text())
        seen[(recipe, name)] = (config["data"]["seed"], manifest["seeds"])
    assert seen[("prenorm-12l", "smoke-seed3")] == (3, {"init": 3, "data_order": 3})
    assert seen[("postnorm-12l", "smoke-seed3")] == (3, {"init": 3, "data_order": 3})  # paired by seed
    assert seen[("prenorm-12l", "smoke-seed3-data1")] == (1, {"init": 3, "data_order": 1})
