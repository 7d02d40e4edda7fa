"""The depth axis of compare: each (recipe, depth) tuned on its own, its run directories, an interrupted
sweep across depths, the figures and tables it writes, and the layer-contribution measurement."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from resnorm_lm.analysis import compare
from resnorm_lm.analysis import launchers as sweep_runner
from resnorm_lm.analysis.block_measurements import (
    angular_distance,
    layer_contribution_main,
    measure,
    run_contribution,
    skipped,
)
from resnorm_lm.analysis.launchers import RunningFits, step_seconds_at, step_seconds_by_blocks, timing_line
from resnorm_lm.analysis.sweep import Arm, RunSpec, Setting, run_sweep, sweep_arms
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.train.lightning_module import LanguageModel
from resnorm_lm.train.optim import OptimConfig
from resnorm_lm.train.recipes import recipe_at_depth, recipe_depth, recipe_path
from resnorm_lm.train.runs import RunDir
from tests.smoke import tiny_sweep, write_learnable_corpus

LRS = [1e-3, 2e-3, 4e-3]
# the best lr moves with depth: 1e-3 at 2 blocks, 4e-3 at 4, 2e-3 at the recipe's own 12
BEST_LR = {2: 1e-3, 4: 4e-3, 12: 2e-3}


def depth_loss(n_layer: int, lr: float, seed: int) -> float:
    return 4.0 + abs(math.log2(lr / BEST_LR[n_layer])) * 0.3 + 0.01 * seed


class Interrupted(Exception):
    """The machine went away in the middle of a run."""


class DepthTrainer:
    """Stands in for compare's SweepTrainer. 'Training' a run writes what a finished run leaves: eval.json
    (validation and test at a scripted loss), config.yaml and, with ``data``, metrics.csv with per-layer
    gradient norms and a real untrained checkpoint of the run's depth. ``stop_after=k``: the (k+1)-th run is
    left half done (a checkpoint, no eval.json) and the sweep stops there."""

    def __init__(self, root: Path, loss, data: dict | None = None, stop_after: int | None = None) -> None:
        self.root, self.loss, self.data, self.stop_after = str(root), loss, data, stop_after
        self.trained: list[tuple[RunSpec, bool]] = []  # (spec, resumed)
        self.planned: list[tuple[str, int, int, int]] = []  # (what, runs, to train, to resume)

    def plan(self, specs, what, training=True):
        states = [RunDir(s.run_dir(self.root, "smoke")).state() for s in specs]
        todo = [s for s, state in zip(specs, states) if state != "finished"]
        self.planned.append((what, len(specs), len(todo), states.count("unfinished")))
        return todo

    def train_all(self, specs):
        for spec in specs:
            run_dir = spec.run_dir(self.root, "smoke")
            n_layer = spec.depth or recipe_depth(spec.recipe, "smoke")
            if self.stop_after is not None and len(self.trained) == self.stop_after:
                (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
                (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"half a run")
                raise Interrupted(str(run_dir))
            self.trained.append((spec, RunDir(run_dir).state() == "unfinished"))
            run_dir.mkdir(parents=True, exist_ok=True)
            loss = self.loss(n_layer, spec.setting.lr, spec.seed)
            split = {"loss": loss, "ppl": math.exp(loss), "bpb": loss / math.log(2)}
            summary = {
                "finished": True,
                "step": 5,
                "params": 1000 * n_layer,
                "tokens": 640,
                "wall_s": 1.0,
                "clip": {"max_norm": 1.0, "steps": 5, "clipped_steps": 1, "clipped_fraction": 0.2},
                "eval": {
                    "step": 5,
                    "validation": split,
                    "test": split,
                    "precision": "32-true",
                    "trained_precision": "32-true",
                },
            }
            (run_dir / "eval.json").write_text(json.dumps(summary))
            if self.data is not None:
                self.write_run(run_dir, spec, n_layer)

    def write_run(self, run_dir: Path, spec: RunSpec, n_layer: int) -> None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"data": self.data}))
        with (run_dir / "metrics.csv").open("w", newline="") as f:
            layers = [f"{m}/layer_{i:02d}" for m in ("grad_norm", "stream_rms") for i in range(n_layer)]
            writer = csv.DictWriter(f, fieldnames=["step", "train/loss", *layers])
            writer.writeheader()
            for step, scale in ((0, 1.0), (4, 0.5)):
                norms = {k: scale * (i % n_layer + 1) for i, k in enumerate(layers)}
                writer.writerow({"step": step, "train/loss": 6.0 - step / 4, **norms})
        recipe_arch = yaml.safe_load(recipe_path(spec.recipe).read_text())["model"]["arch"]
        arch = GPTConfig(
            vocab_size=self.data["vocab_size"],
            block_size=self.data["block_size"],
            n_layer=n_layer,
            n_head=2,
            n_embd=32,
            **{k: recipe_arch[k] for k in ("placement", "qk_norm") if k in recipe_arch},
        )
        torch.manual_seed(spec.seed)
        model = LanguageModel(arch=arch, optim=OptimConfig())
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        torch.save(
            {
                "state_dict": model.state_dict(),
                "global_step": 5,
                "hyper_parameters": {"arch": asdict(arch), "optim": asdict(OptimConfig())},
                "datamodule_hyper_parameters": self.data,
            },
            run_dir / "checkpoints" / "last.ckpt",
        )


def sweep_args(root: Path, **kw) -> SimpleNamespace:
    args = dict(
        recipes=["prenorm-12l"],
        lrs=LRS,
        warmups=[0.33],
        grid_seeds=[1],
        seeds=[1, 2, 3],
        no_train=False,
        root=str(root),
        depths=[2, 4, 12],
        lrs_at={},
        eval_precision="run",
    )
    return SimpleNamespace(**{**args, **kw})


# ---------------------------------------------------------------------- names and directories


def test_a_depth_is_a_run_tag_and_an_override_and_the_recipes_own_depth_is_neither():
    spec = RunSpec("prenorm-12l", Setting(1e-3, 0.2), 1, depth=48)
    assert spec.tag == "d48-lr0.001-wf0.2" and spec.arm == Arm("prenorm-12l", 48)
    assert spec.run_dir("runs", "cpu") == Path("runs/prenorm-12l/cpu-d48-lr0.001-wf0.2-seed1")
    overrides = ["--model.arch.n_layer=48", "--model.optim.lr=0.001", "--model.optim.warmup_fraction=0.2"]
    assert spec.overrides() == overrides
    assert RunSpec("prenorm-12l", Setting(), 2, depth=6).run_dir("runs", "cpu") == Path("runs/prenorm-12l/cpu-d6-seed2")
    # the recipe's own depth is no override: the directories of a sweep without depths (and of make train)
    assert sweep_arms(["prenorm-12l", "deepnorm-24l"], [6, 12, 24], "cpu") == {
        Arm("prenorm-12l", 6): 6,
        Arm("prenorm-12l"): 12,
        Arm("prenorm-12l", 24): 24,
        Arm("deepnorm-24l", 6): 6,
        Arm("deepnorm-24l", 12): 12,
        Arm("deepnorm-24l"): 24,
    }
    assert sweep_arms(["prenorm-12l", "deepnorm-24l"], None, "cpu") == {Arm("prenorm-12l"): 12, Arm("deepnorm-24l"): 24}
    assert RunSpec("prenorm-12l", Setting(1e-3, 0.2), 1).tag == "lr0.001-wf0.2"
    assert (
        recipe_at_depth("prenorm-12l", 48) == "prenorm-48l"
        and recipe_at_depth("b2t-12l-rmsnorm", 6) == "b2t-6l-rmsnorm"
    )
    assert recipe_at_depth("mine", 6) == "mine-d6"


def test_the_trainer_trains_and_resumes_a_depth_with_its_override_and_the_cli_builds_that_depth(
    tmp_path, monkeypatch, capsys
):
    """The command compare runs for a depth: its tag, its n_layer override after the recipe's configs (so it
    wins, as LightningCLI resolves it) and --ckpt_path=last for a half-done run; none for the recipe's own."""
    from resnorm_lm.train.lightning_cli import ResnormCLI
    from resnorm_lm.train.recipes import expand_recipe_arguments

    commands = []
    monkeypatch.setattr(RunningFits, "run", lambda self, cmd, **k: commands.append(cmd) or 0)
    trainer = sweep_runner.SweepTrainer("smoke", str(tmp_path), [], jobs=1)
    deep, own = RunSpec("prenorm-12l", Setting(1e-3, 0.33), 1, depth=3), RunSpec("prenorm-12l", Setting(1e-3, 0.33), 1)
    (deep.run_dir(str(tmp_path), "smoke") / "checkpoints").mkdir(parents=True)
    (deep.run_dir(str(tmp_path), "smoke") / "checkpoints" / "last.ckpt").write_bytes(b"x")
    trainer.train_all([deep, own])
    assert "--model.arch.n_layer=3" in commands[0] and "--run.tag=d3-lr0.001-wf0.33" in commands[0]
    assert "--ckpt_path=last" in commands[0]  # resumed, in its own directory
    assert not any("n_layer" in a for a in commands[1]) and "--run.tag=lr0.001-wf0.33" in commands[1]
    assert "--ckpt_path=last" not in commands[1]
    fit = [a for a in commands[0][commands[0].index("fit") :] if a != "--ckpt_path=last"]
    monkeypatch.setattr("sys.argv", ["resnorm-lm"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        ResnormCLI(args=expand_recipe_arguments([*fit, "--print_config"]))
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["model"]["arch"]["n_layer"] == 3 and config["run"]["tag"] == "d3-lr0.001-wf0.33"


# ---------------------------------------------------------------------- the sweep across depths


def test_an_interrupted_sweep_across_depths_resumes_and_picks_each_depth_on_its_own(tmp_path):
    # interrupted in the middle of the grid: 4 runs finished, the 5th half done
    first = DepthTrainer(tmp_path, depth_loss, stop_after=4)
    with pytest.raises(Interrupted):
        run_sweep(sweep_args(tmp_path), "smoke", first)
    second = DepthTrainer(tmp_path, depth_loss)
    selections, runs = run_sweep(sweep_args(tmp_path), "smoke", second)
    assert second.planned[0] == ("grid", 9, 5, 1)  # 3 depths x 3 lrs: 4 finished, 5 to train, 1 of them resumed
    resumed = [spec for spec, was in second.trained if was]
    assert resumed == [first_half_done := RunSpec("prenorm-12l", Setting(LRS[1], 0.33), 1, depth=4)]
    assert not {s for s, _ in first.trained} & {s for s, _ in second.trained}  # nothing finished is trained again
    assert first_half_done.run_dir(str(tmp_path), "smoke").name == "smoke-d4-lr0.002-wf0.33-seed1"
    # the selection rule, per depth: each depth's own pick, 3 seeds at it, its own edge flag
    for depth, arm, edge in (
        (2, Arm("prenorm-12l", 2), "lowest"),
        (4, Arm("prenorm-12l", 4), "highest"),
        (12, Arm("prenorm-12l"), None),
    ):
        sel = selections[arm]
        assert sel.chosen.setting == Setting(BEST_LR[depth], 0.33) and sel.n_layer == depth, depth
        assert sorted(o.spec.seed for o in sel.chosen.outcomes) == [1, 2, 3] and sel.lr_edge == edge
    names = sorted(d.name for d in (tmp_path / "prenorm-12l").iterdir())
    assert "smoke-lr0.002-wf0.33-seed3" in names and "smoke-d2-lr0.001-wf0.33-seed3" in names  # 12: the recipe's own
    assert len(runs) == 9 + 3 * 2 and len(names) == len(runs)
    third = DepthTrainer(tmp_path, depth_loss)  # all done: nothing trained again
    assert run_sweep(sweep_args(tmp_path), "smoke", third)[0].keys() == selections.keys() and not third.trained


def test_a_depth_gets_its_own_lr_grid_from_lrs_at(tmp_path):
    trainer = DepthTrainer(tmp_path, depth_loss)
    args = sweep_args(tmp_path, depths=[2, 4], lrs_at={4: [4e-3, 8e-3]}, seeds=[1])
    selections, runs = run_sweep(args, "smoke", trainer)
    assert sorted(sc.setting.lr for sc in selections[Arm("prenorm-12l", 4)].scores) == [4e-3, 8e-3]
    assert sorted(sc.setting.lr for sc in selections[Arm("prenorm-12l", 2)].scores) == LRS
    assert selections[Arm("prenorm-12l", 4)].lr_edge == "lowest"  # the trimmed grid says it was too high
    assert len(runs) == 5


def test_the_time_estimate_is_measured_per_depth_and_scaled_from_the_nearest_where_none_ran(tmp_path):
    def finished(name: str, n_layer: int, wall_s: float, done: bool = True) -> None:
        run = tmp_path / "prenorm-12l" / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump({"model": {"arch": {"n_layer": n_layer}}}))
        (run / "eval.json").write_text(json.dumps({"finished": done, "wall_s": wall_s, "step": 100}))

    finished("cpu-d6-lr0.001-wu200-seed1", 6, 50.0)
    finished("cpu-d6-lr0.002-wu200-seed1", 6, 70.0)
    finished("cpu-d24-lr0.001-wu200-seed1", 24, 200.0)
    finished("cpu-d24-lr0.002-wu200-seed1", 24, 9999.0, done=False)  # unfinished: not timed
    finished("gpu-d24-lr0.001-wu200-seed1", 24, 9999.0)  # another profile
    rates = step_seconds_by_blocks(tmp_path, "cpu")
    assert {n: sorted(r) for n, r in rates.items()} == {6: [0.5, 0.7], 24: [2.0]}
    assert step_seconds_at(6, rates) == (pytest.approx(0.6), 6)  # the median at its own depth
    assert step_seconds_at(48, rates) == (pytest.approx(4.0), 24)  # none at 48: 24's, times 48/24
    assert step_seconds_at(12, rates) == (pytest.approx(1.2), 6)  # equally near 6 and 24: the shallower
    assert step_seconds_at(12, {}) == (None, None)
    assert timing_line([6, 48], rates) == "0.60 at 6 blocks, 4.00 at 48 blocks (scaled from 24)"


def test_depth_arguments_are_checked(capsys):
    for argv, said in (
        (["--lrs-at", "48=1e-3"], "is not one of --depths"),
        (["--depths", "6", "--lrs-at", "6:1e-3"], "is not DEPTH=LR,LR"),
        (["--depths", "6", "--lrs-at", "6=1e-3,-1"], "must be > 0"),
        (["--depths", "0"], ">= 1"),
        (["--depths", "6", "--train-args=--model.arch.n_layer=3"], "give depths by --depths"),
        (["--contribution-tokens", "-1"], ">= 0"),
    ):
        with pytest.raises(SystemExit) as exit_:
            compare.parse_args(argv)
        assert exit_.value.code == 2 and said in capsys.readouterr().err, argv
    args = compare.parse_args(["--depths", "12", "6", "12", "--lrs-at", "6=1e-3,2e-3"])
    assert args.depths == [6, 12] and args.lrs_at == {6: [1e-3, 2e-3]}


# ---------------------------------------------------------------------- compare end to end, scripted runs


@pytest.fixture
def scripted_compare(tmp_path, monkeypatch):
    """compare.main with its trainer replaced by DepthTrainer writing real (untrained) checkpoints."""
    corpus = write_learnable_corpus(tmp_path / "corpus", n_files=6, words_per_file=150)
    data = {
        "corpus": "text",
        "files": [corpus],
        "vocab_size": 512,
        "block_size": 32,
        "batch_size": 4,
        "eval_batch_size": 64,
        "cache_dir": str(tmp_path / "cache"),
    }
    trainers = []

    def factory(profile, root, extra, jobs, group=None):
        trainers.append(DepthTrainer(Path(root), lambda n, lr, seed: 4.0 + n * 0.01 + lr * 10 + 0.01 * seed, data))
        return trainers[-1]

    monkeypatch.setattr(compare, "SweepTrainer", factory)

    def run(*argv: str) -> int:
        return compare.main(
            [
                "--profile",
                "smoke",
                "--root",
                str(tmp_path / "runs"),
                "--results",
                str(tmp_path / "results"),
                "--lrs",
                "1e-3",
                "2e-3",
                "--warmups",
                "0.33",
                *argv,
            ]
        )

    return SimpleNamespace(run=run, trainers=trainers, out=tmp_path / "results" / "smoke", runs=tmp_path / "runs")


def nonempty(path: Path, kind: str) -> None:
    data = path.read_bytes()
    assert data, path
    if kind == "png":
        assert data.startswith(b"\x89PNG") and len(data) > 5_000, path
    elif kind == "csv":
        rows = list(csv.DictReader(path.open()))
        optional = {"warmup_edge"}  # empty where the warmup is inside its grid, as in a sweep of one warmup
        assert rows and all(v for k, v in rows[0].items() if k not in optional), path
    else:
        assert data.decode().count("\n|") >= 3, path  # a markdown table with rows


@pytest.mark.training
def test_compare_with_depths_writes_every_figure_and_table(scripted_compare, capsys):
    assert (
        scripted_compare.run("--recipes", "prenorm-12l", "resi_dual-12l", "--depths", "1", "2", "--seeds", "1", "2")
        == 0
    )
    out = scripted_compare.out
    for name in ("compare.md", "depth.md", "layer_contribution.md"):
        nonempty(out / name, "md")
    for name in ("compare.csv", "grid.csv", "depth.csv"):
        nonempty(out / name, "csv")
    for name in (
        "depth_loss.png",
        "depth_lr.png",
        "stability_map.png",
        "depth_grad_norms.png",
        "layer_contribution.png",
        "lr_sensitivity.png",
        "loss_curves.png",
        "grad_norms.png",
        "depth_stream_rms.png",
        "stream_rms.png",
    ):
        nonempty(out / name, "png")
    table = list(csv.DictReader((out / "compare.csv").open()))
    assert sorted((r["recipe"], r["n_layer"]) for r in table) == [
        ("prenorm-12l", "1"),
        ("prenorm-12l", "2"),
        ("resi_dual-12l", "1"),
        ("resi_dual-12l", "2"),
    ]
    assert "| recipe | layers | lr |" in (out / "compare.md").read_text()
    assert "| recipe | depth 1 | depth 2 |" in (out / "depth.md").read_text()
    # the layer contribution: every block of every seed at every pick, measured on the runs' checkpoints
    contribution = list(csv.DictReader((out / "layer_contribution.csv").open()))
    assert len(contribution) == 2 * (1 + 2) * 2  # recipes x blocks over the depths x seeds
    assert all(0.0 <= float(r["angular_distance"]) <= 1.0 for r in contribution)
    assert all(math.isfinite(float(r["loss_increase"])) for r in contribution)
    tuned = out / "tuned"
    assert sorted(p.name for p in tuned.iterdir()) == [
        "prenorm-1l.yaml",
        "prenorm-2l.yaml",
        "resi_dual-1l.yaml",
        "resi_dual-2l.yaml",
    ]
    assert "measured as prenorm-12l at 2 blocks" in (tuned / "prenorm-2l.yaml").read_text()
    # checkpoints gone (results from another machine): the cached measurement redraws the same table
    for ckpt in scripted_compare.runs.glob("*/*/checkpoints/last.ckpt"):
        ckpt.unlink()
    assert (
        scripted_compare.run(
            "--recipes", "prenorm-12l", "resi_dual-12l", "--depths", "1", "2", "--seeds", "1", "2", "--no-train"
        )
        == 0
    )
    assert list(csv.DictReader((out / "layer_contribution.csv").open())) == contribution
    assert not scripted_compare.trainers[-1].trained


@pytest.mark.training
def test_without_depths_compare_is_as_before_and_a_depth_sweep_reuses_the_recipes_own_runs(scripted_compare):
    assert scripted_compare.run("--recipes", "prenorm-12l") == 0
    before = sorted(p.name for p in (scripted_compare.runs / "prenorm-12l").iterdir())
    assert before == ["smoke-lr0.001-wf0.33-seed1", "smoke-lr0.002-wf0.33-seed1"]  # today's names
    out = scripted_compare.out
    assert not any((out / name).exists() for name in ("depth.md", "stability_map.png", "layer_contribution.csv"))
    assert "layers" not in (out / "compare.md").read_text() and (out / "tuned" / "prenorm-12l.yaml").is_file()
    # the same recipe with depths 2 and 12 (its own): only the 2-block runs are new
    assert scripted_compare.run("--recipes", "prenorm-12l", "--depths", "2", "12") == 0
    assert {s.depth for s, _ in scripted_compare.trainers[-1].trained} == {2}
    after = sorted(p.name for p in (scripted_compare.runs / "prenorm-12l").iterdir())
    assert sorted(set(after) - set(before)) == ["smoke-d2-lr0.001-wf0.33-seed1", "smoke-d2-lr0.002-wf0.33-seed1"]


# ---------------------------------------------------------------------- layer contribution


def tiny(placement: str, n_layer: int = 3, **kw) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=64, block_size=16, n_layer=n_layer, n_head=2, n_embd=32, placement=placement, **kw)
    ).eval()


def test_angular_distance_is_in_zero_one_and_zero_for_the_same_direction():
    a = torch.randn(4, 8, 32)
    assert angular_distance(a, a).abs().max() < 1e-6  # the same vector: 0 (fp64 keeps arccos near 1 honest)
    assert angular_distance(a, 3.0 * a).abs().max() < 1e-6  # a block that only rescales: no change of direction
    assert torch.allclose(angular_distance(a, -a), torch.ones(4, 8, dtype=torch.float64))
    e1, e2 = torch.eye(2)
    assert angular_distance(e1, e2).item() == pytest.approx(0.5)
    d = angular_distance(a, torch.randn(4, 8, 32))
    assert d.shape == (4, 8) and ((d >= 0) & (d <= 1)).all()


@pytest.mark.parametrize("placement", ["prenorm", "postnorm", "resi_dual", "deepnorm"])
def test_skipping_a_block_changes_the_loss_by_a_finite_amount_and_leaves_the_model_as_it_was(placement):
    model = tiny(placement)
    x, y = torch.randint(0, 64, (6, 16)), torch.randint(0, 64, (6, 16))
    y[-1, 10:] = -100  # a last window's padding: not a token
    before, _ = model(x)
    result = measure(model, x, y, batch_size=4)
    assert result.tokens == 6 * 16 - 6 and len(result.loss_increase) == 3
    assert all(math.isfinite(v) for v in [result.loss, *result.skipped_loss])
    assert all(0.0 < d <= 1.0 for d in result.angular_distance)
    # padding counts for nothing: causal attention makes the padded window's first 10 positions a window of 10
    full, tail = measure(model, x[:5], y[:5]), measure(model, x[5:, :10], y[5:, :10])
    for got, a, b in (
        (result.angular_distance, full.angular_distance, tail.angular_distance),
        (result.skipped_loss, full.skipped_loss, tail.skipped_loss),
    ):
        assert got == pytest.approx([(80 * u + 10 * v) / 90 for u, v in zip(a, b)], rel=1e-5)
    mean_squares = [(80 * u**2 + 10 * v**2) / 90 for u, v in zip(full.update_rms, tail.update_rms)]
    assert result.update_rms == pytest.approx([math.sqrt(m) for m in mean_squares], rel=1e-5)
    assert all(u > 0 for u in result.update_rms)
    assert all("forward" not in block.__dict__ and not block._forward_hooks for block in model.blocks)
    assert torch.equal(model(x)[0], before)  # hooks and skips undone
    for block in model.blocks:  # each skip really removes the block's work (an untrained model's loss
        with skipped(block):  # barely moves: its logits are near zero)
            assert not torch.allclose(model(x)[0], before)
    block = model.blocks[1]
    stream = model.stream.enter(torch.randn(2, 16, 32))
    with skipped(block):
        passed = block(stream)
    assert passed is stream  # both of ResiDual's streams pass through as they are


def test_an_identity_block_contributes_nothing():
    """A pre-norm block whose output projections are zero adds nothing to its stream; its neighbours do."""
    x, y = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
    model = tiny("prenorm")
    with torch.no_grad():
        for proj in (model.blocks[1].attn.c_proj, model.blocks[1].mlp.c_proj):
            proj.weight.zero_()
            proj.bias.zero_()
    result = measure(model, x, y)
    assert result.loss_increase[1] == pytest.approx(0.0, abs=1e-6) and result.angular_distance[1] < 1e-6
    assert result.angular_distance[0] > 1e-3 and result.angular_distance[2] > 1e-3
    assert result.update_rms[1] == 0.0 and result.update_rms[0] > 1e-3 and result.update_rms[2] > 1e-3


@pytest.mark.parametrize("placement", ["prenorm", "attnres", "attnres_block"])
def test_the_update_rms_is_the_rms_of_what_each_block_adds(placement):
    """Pre-norm's update is its two sublayers' outputs, Attn(LN(x)) + MLP(LN(x + Attn(LN(x)))); AttnRes's is
    its two values v, whatever its queries read: each against a transcription with the block's own modules."""
    model = tiny(placement, n_layer=4)
    x, y = torch.randint(0, 64, (3, 16)), torch.randint(0, 64, (3, 16))
    with torch.no_grad():
        for p in model.parameters():  # off the init (AttnRes's queries at zero), so the mixes are not uniform
            p.add_(0.05 * torch.randn_like(p))
    inputs = []
    hooks = [b.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for b in model.blocks]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    expected = []
    with torch.no_grad():
        for block, stream in zip(model.blocks, inputs):
            if placement == "prenorm":
                a = block.attn(block.attn_norm(stream))
                update = a + block.mlp(block.mlp_norm(stream + a))  # (B, T, C)
            elif placement == "attnres":
                after = block(stream)  # (v_0 .. v_l) and the block's two values, v_attn and v_mlp
                assert len(after) == len(stream) + 2
                update = after[-2] + after[-1]
            else:  # Block AttnRes: its outputs go into the depth-blocks' sums, begun or partial
                update = sum(block(stream)) - sum(stream)
            expected.append(update.double().square().mean().sqrt().item())
    assert measure(model, x, y).update_rms == pytest.approx(expected, rel=1e-6)


def test_skipping_a_block_of_a_trained_model_costs_loss():
    model = tiny("prenorm", n_layer=2).train()
    x = torch.arange(16).repeat(8, 1) % 7  # a pattern a two-block model learns in a few steps
    y = torch.roll(x, -1, dims=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(30):
        optimizer.zero_grad()
        model(x, y)[1].backward()
        optimizer.step()
    result = measure(model.eval(), x, y)
    assert result.loss < 0.5 and max(result.loss_increase) > 0.5  # what it learned sits in its blocks


def tiny_run_data(tmp_path: Path) -> dict:
    """The data settings of a run small enough to train in a test, on a learnable corpus written under tmp_path."""
    corpus = write_learnable_corpus(tmp_path / "corpus", n_files=4, words_per_file=150)
    return {
        "corpus": "text",
        "files": [corpus],
        "vocab_size": 300,
        "block_size": 16,
        "batch_size": 4,
        "eval_batch_size": 8,
        "cache_dir": str(tmp_path / "cache"),
    }


def test_a_runs_contribution_is_read_from_its_checkpoint_and_cached(tmp_path, capsys):
    data = tiny_run_data(tmp_path)
    trainer = DepthTrainer(tmp_path / "runs", lambda *a: 5.0, data)
    spec = RunSpec("lns-12l", Setting(1e-3, 0.33), 1, depth=2)
    trainer.train_all([spec])
    run_dir = spec.run_dir(str(tmp_path / "runs"), "smoke")
    record = run_contribution(run_dir, n_tokens=40)
    assert record["tokens"] == 48 and record["step"] == 5 and len(record["angular_distance"]) == 2  # 3 windows
    assert len(record["update_rms"]) == 2
    older = {k: v for k, v in record.items() if k != "update_rms"}  # measured before update_rms was
    (run_dir / "layer_contribution.json").write_text(json.dumps(older))
    assert run_contribution(run_dir, n_tokens=40) == record  # measured again: the weights are here
    assert layer_contribution_main([str(run_dir), "--tokens", "40", "--csv", str(tmp_path / "b.csv")]) == 0
    out = capsys.readouterr().out  # from the cache
    blocks = list(csv.DictReader((tmp_path / "b.csv").open()))
    assert [float(b["update_rms"]) for b in blocks] == pytest.approx(record["update_rms"])
    assert "| run | loss | update RMS, first block | last block | last / first | largest / smallest |" in out
    first, last = record["update_rms"]
    assert f"| {last / first:.2f} | {max(first, last) / min(first, last):.2f} |" in out
    (run_dir / "checkpoints" / "last.ckpt").unlink()
    assert run_contribution(run_dir, n_tokens=40) == record  # from layer_contribution.json
    assert run_contribution(run_dir, n_tokens=80) is None  # another slice needs the weights
    assert layer_contribution_main([str(run_dir), "--tokens", "80"]) == 2
    assert "no checkpoints/last.ckpt to measure" in capsys.readouterr().err
    (run_dir / "layer_contribution.json").write_text(json.dumps(older))
    assert run_contribution(run_dir, n_tokens=40) == older  # no weights: the older measurement, as it is
    assert layer_contribution_main([str(run_dir), "--tokens", "40"]) == 2  # it has no update RMS


@pytest.mark.slow
def test_a_real_depth_run_interrupted_then_resumed_through_compare(tmp_path):
    """One tiny real run at a depth other than the recipe's: trained by compare's own subprocess with its
    n_layer override, stopped half way, resumed in its own directory, then measured and drawn."""
    corpus = write_learnable_corpus(tmp_path / "corpus", n_files=6, words_per_file=150)

    def run(train_args: str = "") -> subprocess.CompletedProcess:
        # tiny_sweep adds --lrs 1e-5 3e-3: at one seed, the grid at depth 2 is two runs
        return tiny_sweep(
            tmp_path,
            corpus,
            "--depths",
            "2",
            "--seeds",
            "1",
            "--contribution-tokens",
            "64",
            train_args=f"--trainer.max_steps=4 --trainer.val_check_interval=4 {train_args}",
        )

    first = run("--run.stop_after_steps=2")
    assert first.returncode == 1 and "compare: grid: 2 runs, 0 finished, 2 to train" in first.stdout, first.stderr
    second = run()
    assert second.returncode == 0, second.stderr[-3000:]
    assert "compare: grid: 2 runs, 0 finished, 2 to train (2 to resume)" in second.stdout
    assert second.stdout.count("compare: resuming prenorm-12l (smoke, 2 layers") == 2
    run_dir = tmp_path / "runs" / "prenorm-12l" / "smoke-d2-lr0.003-wf0.33-seed1"
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["arch"]["n_layer"] == 2
    assert len(json.loads((run_dir / "manifest.json").read_text())["segments"]) == 2  # one run, resumed
    out = tmp_path / "results" / "smoke"
    contribution = list(csv.DictReader((out / "layer_contribution.csv").open()))
    assert [r["layer"] for r in contribution] == ["0", "1"] and contribution[0]["tokens"] == "64"
    for name in ("depth_loss.png", "depth_lr.png", "stability_map.png", "depth_grad_norms.png"):
        nonempty(out / name, "png")
