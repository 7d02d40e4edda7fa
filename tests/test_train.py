"""Training: recipes x profiles, the CLI's errors, a smoke run's outputs, exact resume, DDP."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from resnorm_lm.data import prepare
from resnorm_lm.data.sampling import ResumableBatchSampler
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.train.optim import OptimConfig
from resnorm_lm.train.recipes import available_profiles, available_recipes
from resnorm_lm.train.runs import RunDir
from tests.smoke import final_weights, resnorm_lm_process, run_cli, smoke_args, train_losses

# ---------------------------------------------------------------- recipes and profiles


def test_the_promised_recipes_and_profiles_exist():
    placements = ["prenorm", "postnorm", "sandwich", "deepnorm", "rezero", "mixln", "lns", "b2t", "resi_dual"]
    expected = {f"{p}-12l" for p in placements + ["noresidual"]}
    expected |= {
        "prenorm-12l-rmsnorm",
        "prenorm-12l-scalenorm",
        "prenorm-12l-dyt",
        "prenorm-12l-dyt-llm",
        "prenorm-12l-dyt-lnout",
    }
    expected |= {"postnorm-12l-rmsnorm"}
    expected |= {"prenorm-12l-triton", "postnorm-12l-triton", "postnorm-12l-nowarmup", "prenorm-12l-nowarmup"}
    expected |= {"prenorm-24l", "postnorm-24l", "deepnorm-24l"}
    expected |= {f"{p}-{n}l-xavier" for p in ("prenorm", "postnorm", "deepnorm") for n in (12, 24)}
    expected |= {"b2t-12l-paper", "rezero-12l-paper", "resi_dual-12l-paper", "sandwich-12l-paper", "prenorm-12l-plain"}
    assert expected <= set(available_recipes())
    assert {"cpu", "gpu", "smoke"} <= set(available_profiles())


@pytest.mark.training
@pytest.mark.parametrize("profile", ["cpu", "gpu"])  # smoke: test_every_recipe_trains_on_the_smoke_profile
def test_every_recipe_instantiates_with_every_profile(profile, capsys):
    for recipe in available_recipes():
        code = run_cli(["fit", "--recipe", recipe, "--profile", profile, "--print_config"])
        out = capsys.readouterr().out
        assert code == 0, f"{recipe} x {profile}: exit {code}"
        config = yaml.safe_load(out)
        arch = dict(config["model"]["arch"], vocab_size=config["data"]["vocab_size"])
        arch["block_size"] = config["data"]["block_size"]
        assert f"{arch['n_layer']}l" == recipe.split("-")[1], recipe  # the name's depth is the model's
        # the name's placement is the model's, but for a paper's own variant of it (sandwich-12l-paper: peri_ln)
        assert arch["placement"] == recipe.split("-")[0] or recipe.endswith("-paper"), recipe
        with torch.device("meta"):  # build without allocating: GPT-2-small x 24 layers included; the
            # -triton recipes build here because the tests run the kernels in the interpreter (conftest)
            model = GPT(GPTConfig(**arch))
        assert len(model.blocks) == arch["n_layer"] and model.config.placement == arch["placement"]
        OptimConfig(**config["model"]["optim"])


def test_print_config_resolves_profile_then_recipe(capsys):
    assert run_cli(["fit", "--recipe", "postnorm-12l-nowarmup", "--profile", "cpu", "--print_config"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["model"]["arch"]["placement"] == "postnorm"  # from the recipe
    assert config["model"]["optim"]["warmup_fraction"] == 0  # the recipe overrides the profile's 0.1
    assert config["model"]["arch"]["n_embd"] == 128  # from the profile
    assert config["run"] == {**config["run"], "recipe": "postnorm-12l-nowarmup", "profile": "cpu"}


def test_unknown_recipe_lists_the_available_ones(capsys):
    assert run_cli(["fit", "--recipe", "prenorm-13l", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'prenorm-13l'" in err and "prenorm-12l" in err and "deepnorm-24l" in err


def test_unknown_profile_lists_the_available_ones(capsys):
    assert run_cli(["fit", "--recipe", "prenorm-12l", "--profile", "tpu"]) == 2
    assert "unknown profile 'tpu'; available profiles: auto, cpu, gpu, smoke" in capsys.readouterr().err


def test_profile_auto_picks_cpu_here_and_says_so(capsys):
    assert run_cli(["fit", "--recipe", "prenorm-12l", "--profile", "auto", "--print_config"]) == 0
    captured = capsys.readouterr()
    assert "PROFILE=auto picked 'cpu' (no CUDA GPU)" in captured.err
    assert yaml.safe_load(captured.out)["run"]["profile"] == "cpu"


@pytest.mark.parametrize(
    "override, message",
    [
        ("--model.arch.n_layr=3", "n_layr"),
        ("--trainer.max_steps=many", "max_steps"),
        ("--model.arch.placement=peri", "unknown placement 'peri'"),
        ("--model.arch.n_head=5", r"n_embd \(32\) must be divisible by n_head \(5\)"),
        ('--model.optim.lr_multipliers={"*.quer": 0.1}', r"no parameter's name matches '\*\.quer'"),
    ],
)
def test_bad_config_fails_before_any_work(override, message, tmp_path, smoke_corpus, capsys):
    code = run_cli(smoke_args(smoke_corpus, override, f"--run.root={tmp_path / 'runs'}", cache_dir=tmp_path / "cache"))
    assert code != 0
    err = capsys.readouterr().err
    assert re.search(message, err), err[-2000:]
    assert not (tmp_path / "cache").exists()  # no data prepared, nothing trained
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- optimizer (the schedules: test_schedules.py)


def test_weight_decay_only_on_matrices():
    from resnorm_lm.train.optim import parameter_groups

    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16, placement="rezero"))
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 for p in decay["params"])
    assert "wpe.weight" in {names[id(p)] for p in no_decay["params"]}
    assert "wte.weight" in {names[id(p)] for p in decay["params"]}
    assert any(names[id(p)].endswith(".alpha") for p in no_decay["params"])  # ReZero's gates
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_lr_multipliers_give_the_matched_parameters_a_fraction_of_every_step_on_the_same_schedule():
    """AttnRes's depth queries at a tenth of the LR: their own group, the same decay rule, the same schedule; the
    rest exactly as without the option; a pattern that matches nothing fails and names what the names look like."""
    from resnorm_lm.model.gpt import GPT, GPTConfig
    from resnorm_lm.train.optim import OptimConfig, build_optimizer, parameter_groups

    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16, placement="attnres"))
    names = {id(p): n for n, p in model.named_parameters()}
    plain = parameter_groups(model, 0.1)
    cfg = OptimConfig(lr=4e-3, schedule="wsd", warmup_fraction=0.25, lr_multipliers={"*.query": 0.1})
    optimizer, schedule = build_optimizer(model, cfg, max_steps=8)
    groups = optimizer.param_groups
    assert [names[id(p)] for p in groups[0]["params"]] == [names[id(p)] for p in plain[0]["params"]]
    queries = groups[2]["params"]
    assert sorted(names[id(p)] for p in queries) == sorted(n for n in names.values() if n.endswith(".query"))
    assert len(queries) == 4 and groups[2]["weight_decay"] == 0.0  # 3 sublayers' and the readout's; 1-D
    assert {names[id(p)] for p in groups[1]["params"]} == {names[id(p)] for p in plain[1]["params"]} - {
        names[id(p)] for p in queries
    }
    for _ in range(3):
        optimizer.step()
        schedule.step()
        assert groups[2]["lr"] == pytest.approx(0.1 * groups[0]["lr"]) and groups[0]["lr"] > 0
    with pytest.raises(ValueError, match=r"no parameter's name matches '\*\.queries'.*wte\.weight"):
        parameter_groups(model, 0.1, 4e-3, {"*.queries": 0.1})
    with pytest.raises(ValueError, match=r"must be >= 0"):
        OptimConfig(lr_multipliers={"*.query": -0.1})
    unchanged = build_optimizer(model, OptimConfig(lr=4e-3), max_steps=8)[0].param_groups
    assert len(unchanged) == 2 and unchanged[0]["lr"] == unchanged[1]["lr"]  # without it: the two groups, one LR


def test_an_lr_multiplier_of_zero_freezes_the_matched_parameters_and_nothing_else():
    """AttnRes with its queries frozen at zero (the probe's control arm): they receive gradients at w = 0 (the logit
    is w . RMSNorm(v)), and AdamW at factor 0 moves neither them nor, through weight decay, anything it should not."""
    from resnorm_lm.model.gpt import GPT, GPTConfig
    from resnorm_lm.train.optim import OptimConfig, build_optimizer

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16, placement="attnres"))
    cfg = OptimConfig(lr=4e-3, schedule="constant", warmup_fraction=0.0, lr_multipliers={"*.query": 0.0})
    optimizer, _ = build_optimizer(model, cfg, max_steps=4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(0, 64, (2, 8))
    for _ in range(3):
        optimizer.zero_grad()
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])  # (B, T-1) tokens predict the next
        loss.backward()
        queries = [p for n, p in model.named_parameters() if n.endswith(".query")]
        assert any(q.grad.abs().sum() > 0 for q in queries)  # gradients reach them: the freeze is the optimizer's
        optimizer.step()
    for name, p in model.named_parameters():
        if name.endswith(".query"):
            assert torch.equal(p, before[name]) and not p.any(), name
    assert not torch.equal(model.wte.weight, before["wte.weight"])  # the rest trains at the full LR


# ---------------------------------------------------------------- a run and its outputs


def test_smoke_run_writes_its_run_directory_and_result_line(tmp_path, smoke_corpus, capsys):
    root = tmp_path / "runs"
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--seed_everything=3")) == 0
    out = capsys.readouterr().out
    run_dir = root / "prenorm-12l" / "smoke-seed3"
    result = next(line for line in out.splitlines() if line.startswith("RESULT "))
    fields = dict(kv.split("=", 1) for kv in result.split()[1:])
    assert {"run", "step", "val_loss", "val_ppl", "val_bpb", "tokens"} <= set(fields)
    assert fields["step"] == "6" and fields["tokens"] == str(6 * 4 * 32)
    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert evaluation["val_ppl"] == pytest.approx(float(fields["val_ppl"]), rel=1e-4)
    assert evaluation["val_ppl"] == pytest.approx(math.exp(evaluation["val_loss"]), rel=1e-5)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["seed"] == 3 and manifest["profile"] == "smoke" and manifest["recipe"] == "prenorm-12l"
    assert manifest["data"]["corpus"] == "text" and len(manifest["data"]["tokenizer_sha256"]) == 64
    assert "torch" in manifest["packages"] and manifest["code_revision"]
    assert (run_dir / "config.yaml").is_file()
    run = RunDir(run_dir)  # the one reader reads what the run wrote
    assert run.state() == "finished" and run.summary() == evaluation and run.manifest() == manifest
    assert run.config()["data"]["corpus"] == "text" and run.init() == "gpt2"
    assert {p.name for p in run.checkpoints()} >= {"last.ckpt", "best.ckpt"}
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "checkpoints" / "best.ckpt").is_file()
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(6)) and all(l == l for l in losses.values())
    header = (run_dir / "metrics.csv").read_text().splitlines()[0]
    for key in (
        "grad_norm/total",
        "grad_norm/layer_00",
        "grad_norm/layer_11",
        "stream_rms/layer_00",
        "stream_rms/layer_11",
        "attn_logit_max/layer_00",
        "attn_logit_max/layer_11",
        "lr-AdamW",
        "val/bpb",
        "val/ppl",
    ):
        assert key in header, key


def test_the_diagnostics_say_the_step_they_were_measured_at(tmp_path, smoke_corpus):
    """Measured where the step is a multiple of log_every_n_steps (the first at the initialization), written by
    Lightning on its next logging row: ``diagnostics/step`` says which, and ``per_block`` reads it."""
    root = tmp_path / "runs"
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--trainer.log_every_n_steps=3")) == 0
    run = RunDir(root / "prenorm-12l" / "smoke-seed1")
    rows = [r for r in run.metrics() if "diagnostics/step" in r]
    assert [(r["step"], r["diagnostics/step"]) for r in rows] == [(2, 0), (5, 3)]
    assert all("grad_norm/layer_00" in r and "attn_logit_max/layer_11" in r for r in rows)
    assert [step for step, _ in run.per_block("attn_logit_max/layer_")] == [0, 3]
    # A run from before the column was logged: the same rows, read at the steps measured all the same.
    lines = run.metrics_path.read_text().splitlines()
    at = lines[0].split(",").index("diagnostics/step")
    kept = [",".join(c for i, c in enumerate(line.split(",")) if i != at) for line in lines]
    run.metrics_path.write_text("\n".join(kept))
    assert "diagnostics/step" not in run.metrics()[0]
    assert [step for step, _ in run.per_block("attn_logit_max/layer_")] == [0, 3]


def test_existing_run_is_not_overwritten_and_resume_without_run_says_so(tmp_path, smoke_corpus, capsys):
    root = tmp_path / "runs"
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--ckpt_path=last")) == 2
    assert "there is no run to resume at" in capsys.readouterr().err
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--trainer.max_steps=2")) == 0
    before = (root / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt").read_bytes()
    capsys.readouterr()
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}")) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (root / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt").read_bytes() == before


def test_resume_with_a_different_architecture_fails_clearly(tmp_path, smoke_corpus, capsys):
    root = tmp_path / "runs"
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--trainer.max_steps=2")) == 0
    code = run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--ckpt_path=last", "--model.arch.n_layer=4"))
    assert code == 2
    assert "model.arch.n_layer: checkpoint 12, now 4" in capsys.readouterr().err


# ---------------------------------------------------------------- exact resume


def batches_per_data_epoch(corpus: str) -> int:
    prepared = prepare("text", files=[corpus], vocab_size=512)  # the smoke runs' data, in the session's cache
    return ResumableBatchSampler(len(prepared.tokens("train")), 32, 4, seed=1337).batches_per_epoch


def resume_matches_uninterrupted(tmp_path: Path, corpus: str, stop: int, total: int) -> None:
    common = ["--model.arch.dropout=0.1", f"--trainer.max_steps={total}", "--run.checkpoint_every=1"]
    common += ["--trainer.val_check_interval=2"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_cli(smoke_args(corpus, f"--run.root={straight}", *common)) == 0
    assert run_cli(smoke_args(corpus, f"--run.root={split}", *common, f"--run.stop_after_steps={stop}")) == 0
    run_dir = split / "prenorm-12l" / "smoke-seed1"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == stop
    assert run_cli(smoke_args(corpus, f"--run.root={split}", *common, "--ckpt_path=last")) == 0
    a, b = train_losses(straight / "prenorm-12l" / "smoke-seed1"), train_losses(run_dir)
    assert sorted(a) == sorted(b) == list(range(total))
    assert [a[s] for s in range(total)] == [b[s] for s in range(total)], f"losses differ: {a} vs {b}"
    wa, wb = final_weights(straight / "prenorm-12l" / "smoke-seed1"), final_weights(run_dir)
    clips = [json.loads((d / "eval.json").read_text())["clip"] for d in (straight / "prenorm-12l/smoke-seed1", run_dir)]
    assert clips[0] == clips[1] and clips[0]["steps"] == total  # the resumed run counts on from its checkpoint
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"{name} differs after resume"


def test_resume_mid_epoch_is_exact(tmp_path, smoke_corpus):
    per_epoch = batches_per_data_epoch(smoke_corpus)
    assert per_epoch >= 4, per_epoch
    resume_matches_uninterrupted(tmp_path, smoke_corpus, stop=per_epoch // 2, total=per_epoch // 2 + 3)


def test_resume_at_a_data_epoch_boundary_is_exact(tmp_path, smoke_corpus):
    per_epoch = batches_per_data_epoch(smoke_corpus)
    resume_matches_uninterrupted(tmp_path, smoke_corpus, stop=per_epoch, total=per_epoch + 3)


# ---------------------------------------------------------------- DDP on CPU


def test_ddp_two_gloo_ranks_train_disjoint_data_to_identical_weights(tmp_path, smoke_corpus):
    probe = tmp_path / "probe"
    probe.mkdir()
    args = smoke_args(
        smoke_corpus,
        f"--run.root={tmp_path / 'runs'}",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_steps=4",
        "--model.arch.dropout=0.1",
        "--trainer.callbacks+=tests.ddp_probe.RecordRankBatches",
    )
    proc = resnorm_lm_process(args, timeout=240, RESNORM_LM_PROBE_DIR=str(probe))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT " in proc.stdout
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    seen = [{tuple(w) for w in rank["windows"]} for rank in ranks]
    assert len(ranks[0]["windows"]) == len(ranks[1]["windows"]) == 4 * 4
    assert not seen[0] & seen[1], "the two ranks trained on the same windows"


@pytest.mark.parametrize("recipe", available_recipes())
def test_every_recipe_trains_on_the_smoke_profile(recipe, recipe_run):
    summary = json.loads((recipe_run(recipe) / "eval.json").read_text())  # the RESULT line's values
    assert summary["finished"] and summary["step"] == 2 and summary["val_ppl"] > 1


@pytest.mark.slow
def test_compiled_model_trains_and_its_checkpoint_loads_uncompiled(tmp_path, smoke_corpus, capsys):
    root = tmp_path / "runs"
    code = run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--model.compile=true", "--trainer.max_steps=3"))
    assert code == 0, capsys.readouterr().err[-2000:]
    from resnorm_lm.train.loaded_run import load_run

    run = load_run(root / "prenorm-12l" / "smoke-seed1")  # plain module, the same state-dict keys
    assert run.global_step == 3
    rows = [r for r in RunDir(root / "prenorm-12l" / "smoke-seed1").metrics() if "stream_rms/layer_11" in r]
    assert rows and rows[0]["step"] == 0 and rows[0]["stream_rms/layer_11"] > 0  # the hooks run compiled too
    assert rows[0]["attn_logit_max/layer_11"] > 0


def test_ddp_is_asked_for_only_with_more_than_one_process(monkeypatch):
    from resnorm_lm.train.lightning_cli import processes

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert processes({"accelerator": "gpu", "devices": -1}) == 1  # the gpu profile on a one-GPU machine: no DDP
    assert processes({"accelerator": "gpu", "devices": -1, "num_nodes": 2}) == 2
    assert processes({"accelerator": "cpu", "devices": 2}) == 2
    assert processes({"accelerator": "gpu", "devices": [0, 1]}) == 2
    assert processes({"accelerator": "cpu", "devices": "auto"}) == 1


def test_a_single_device_run_gets_no_ddp_wrapper(tmp_path, smoke_corpus):
    from resnorm_lm.train.lightning_cli import ResnormCLI
    from resnorm_lm.train.recipes import expand_recipe_arguments

    args = expand_recipe_arguments(smoke_args(smoke_corpus, f"--run.root={tmp_path}", "--trainer.strategy=ddp"))
    cli = ResnormCLI(args=args[1:], run=False)  # without the subcommand: build, do not run
    assert type(cli.trainer.strategy).__name__ == "SingleDeviceStrategy"


def test_a_profile_progress_bar_gives_way_to_enable_progress_bar_false(tmp_path, smoke_corpus):
    """The gpu profile sets a TQDMProgressBar; `--trainer.enable_progress_bar=false` (as `compare --jobs` adds)
    must turn it off instead of failing (seen on an H100: Lightning's MisconfigurationException)."""
    from lightning.pytorch.callbacks import ProgressBar

    from resnorm_lm.train.lightning_cli import ResnormCLI
    from resnorm_lm.train.recipes import expand_recipe_arguments

    bar = (
        '--trainer.callbacks+={"class_path": "lightning.pytorch.callbacks.TQDMProgressBar", '
        '"init_args": {"refresh_rate": 10}}'
    )
    args = expand_recipe_arguments(smoke_args(smoke_corpus, f"--run.root={tmp_path}", bar))
    cli = ResnormCLI(args=args[1:], run=False)
    assert not any(isinstance(c, ProgressBar) for c in cli.trainer.callbacks)
    on = [a for a in args if a != "--trainer.enable_progress_bar=false"]
    cli = ResnormCLI(args=on[1:], run=False)
    assert [c.refresh_rate for c in cli.trainer.callbacks if isinstance(c, ProgressBar)] == [10]


def test_a_tuned_setting_applies_on_top_of_the_recipe_at_its_profile_only(tmp_path):
    from resnorm_lm.train.recipes import expand_recipe_arguments

    root = tmp_path / "recipes"
    (root / "profiles").mkdir(parents=True)
    (root / "tuned" / "cpu").mkdir(parents=True)
    for name in ("cpu", "gpu"):
        (root / "profiles" / f"{name}.yaml").write_text("trainer: {}\n")
    (root / "r-12l.yaml").write_text("model: {}\n")
    (root / "tuned" / "cpu" / "r-12l.yaml").write_text("model: {optim: {lr: 1.0e-3}}\n")
    cpu = expand_recipe_arguments(["fit", "--recipe", "r-12l", "--profile", "cpu", "--model.optim.lr=5e-4"], root)
    configs = [cpu[i + 1] for i, a in enumerate(cpu) if a == "--config"]
    assert configs == [str(root / "profiles/cpu.yaml"), str(root / "r-12l.yaml"), str(root / "tuned/cpu/r-12l.yaml")]
    assert cpu[-1] == "--model.optim.lr=5e-4"  # the command line still wins (compare's sweep relies on it)
    gpu = expand_recipe_arguments(["fit", "--recipe", "r-12l", "--profile", "gpu"], root)
    assert not any(str(root / "tuned") in a for a in gpu)


def test_a_variant_takes_its_bases_tuned_setting_and_every_run_says_where_its_lr_came_from(tmp_path, capsys):
    from resnorm_lm.train.recipes import RecipeError, expand_recipe_arguments

    root = tmp_path / "recipes"
    (root / "profiles").mkdir(parents=True)
    (root / "tuned" / "cpu").mkdir(parents=True)
    (root / "profiles" / "cpu.yaml").write_text("trainer: {}\n")
    (root / "r-12l.yaml").write_text("model: {}\n")
    (root / "r-12l-rms.yaml").write_text("model: {}\nrun: {base: r-12l}\n")
    (root / "lonely-12l.yaml").write_text("model: {}\n")
    (root / "orphan-12l.yaml").write_text("model: {}\nrun: {base: nothing-12l}\n")
    (root / "tuned" / "cpu" / "r-12l.yaml").write_text("model: {optim: {lr: 1.0e-3, warmup_fraction: 0.4}}\n")

    def run(recipe, *extra):
        args = expand_recipe_arguments(["fit", "--recipe", recipe, "--profile", "cpu", *extra], root)
        return [args[i + 1] for i, a in enumerate(args) if a == "--config"], args, capsys.readouterr().err

    configs, args, err = run("r-12l-rms")  # no overlay of its own: its base's
    assert configs[-1] == str(root / "tuned/cpu/r-12l.yaml")
    assert (
        "r-12l-rms has no tuned setting at the cpu profile; it takes its base r-12l's: lr 0.001, "
        "warmup_fraction 0.4 (recipes/tuned/cpu/r-12l.yaml)" in err
    )
    assert "--run.tuned_overlay=recipes/tuned/cpu/r-12l.yaml" in args
    (root / "tuned" / "cpu" / "r-12l-rms.yaml").write_text("model: {optim: {lr: 4.0e-3}}\n")
    configs, args, err = run("r-12l-rms")  # its own, once a sweep wrote it
    assert configs[-1] == str(root / "tuned/cpu/r-12l-rms.yaml") and "tuned setting of r-12l-rms" in err
    configs, args, err = run("lonely-12l", "--model.optim.lr=5e-4")  # neither: said, and the override too
    assert configs == [str(root / "profiles/cpu.yaml"), str(root / "lonely-12l.yaml")]
    assert (
        "lonely-12l has no tuned setting at the cpu profile: its LR and warmup are the profile's untuned defaults"
        in err
        and "the command line sets model.optim.lr" in err
    )
    assert "--run.tuned_overlay=none" in args
    with pytest.raises(RecipeError, match="unknown recipe 'nothing-12l'"):
        run("orphan-12l")


def test_every_variant_in_the_repository_names_a_base_that_exists_and_a_run_records_it(recipe_run):
    from resnorm_lm.train.recipes import available_recipes, recipe_base, tuned_setting

    bases = {r: recipe_base(r) for r in available_recipes()}
    prenorm_variants = ("rmsnorm", "scalenorm", "dyt", "dyt-llm", "dyt-lnout", "triton")
    for variant in [f"prenorm-12l-{v}" for v in prenorm_variants] + ["postnorm-12l-rmsnorm", "postnorm-12l-triton"]:
        assert bases[variant] == variant.split("-")[0] + "-12l"
        assert tuned_setting(variant, "cpu")[0] is not None  # never the profile's untuned 2e-3 in silence
    assert bases["rezero-12l-paper"] == "rezero-12l" and bases["resi_dual-12l-paper"] == "resi_dual-12l"
    assert bases["sandwich-12l-paper"] == "sandwich-12l"
    assert bases["b2t-12l-paper"] is None  # its paper's own recipe: no base, its own LR and warmup, said so
    assert tuned_setting("b2t-12l-paper", "gpu") == (
        None,
        "b2t-12l-paper has no tuned setting at the gpu profile: it sets its own lr 0.001, warmup_fraction 0.08",
    )
    overlay, said = tuned_setting("b2t-12l-paper", "cpu")  # its own grid's pick, where it has been swept
    assert overlay.name == "b2t-12l-paper.yaml" and said.startswith("tuned setting of b2t-12l-paper at the cpu")
    for variant in (r for r in bases if r.endswith("-xavier")):
        assert bases[variant] == variant.removesuffix("-xavier")  # the same placement and depth, GPT-2's init
    manifest = json.loads((recipe_run("prenorm-12l-rmsnorm") / "manifest.json").read_text())
    assert manifest["base_recipe"] == "prenorm-12l" and manifest["tuned_overlay"] == "none"  # smoke: none tuned


def test_adamw_is_fused_on_cpu_and_steps_as_the_loop_over_tensors_does():
    """The fused kernel (the default on CPU as on CUDA) against torch's loop over tensors, over a few steps."""
    from resnorm_lm.train.optim import build_optimizer

    torch.manual_seed(0)
    models = [GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optim = OptimConfig(lr=1e-2, schedule="constant", warmup_fraction=10.0)  # LR 1e-4, 2e-4, 3e-4
    fused, _ = build_optimizer(models[0], optim, 10)
    loop, _ = build_optimizer(models[1], optim, 10, fused=False)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    idx = torch.randint(0, 64, (4, 8))
    for _ in range(3):
        for model, optimizer in ((models[0], fused), (models[1], loop)):
            model(idx, idx)[1].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
