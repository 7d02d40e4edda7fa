"""Sweeps: the grid, the selection rule (validation picks, test reports), not learning vs diverged,
the unigram reference, the cost estimate, untied embeddings, and a tiny real sweep with an interruption."""

from __future__ import annotations

import csv
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from resnorm_lm.analysis.sweep import (
    Arm,
    RunOutcome,
    RunSpec,
    Setting,
    estimate_seconds,
    expand_grid,
    grid_settings,
    select,
)
from resnorm_lm.data.unigram import unigram_cross_entropy
from resnorm_lm.model.gpt import GPT, GPTConfig
from tests.smoke import REPO, TINY_SWEEP_STEPS, default_sigint, run_cli, tiny_sweep, write_learnable_corpus


def outcomes(recipe: str, table: dict[tuple[float, int], list[float | None]]) -> list[RunOutcome]:
    """{(lr, warmup): [val loss per seed, None = diverged]} as run outcomes."""
    out = []
    for (lr, warmup), losses in table.items():
        for seed, loss in enumerate(losses, 1):
            out.append(RunOutcome(RunSpec(recipe, Setting(lr, warmup), seed), loss, diverged=loss is None))
    return out


def test_grid_expansion_tags_and_overrides():
    settings = grid_settings([5e-4, 1e-3], [0.05, 0.2])
    assert [s.tag for s in settings] == ["lr0.0005-wf0.05", "lr0.0005-wf0.2", "lr0.001-wf0.05", "lr0.001-wf0.2"]
    assert Setting(1e-3, 0.2).overrides() == ["--model.optim.lr=0.001", "--model.optim.warmup_fraction=0.2"]
    assert grid_settings(None, None) == [Setting()] and Setting().tag == "" and Setting().overrides() == []
    assert grid_settings(None, [0.0])[0].tag == "wf0"
    specs = expand_grid(["a", "b"], settings, [1, 2])
    assert len(specs) == 16 and len(set(specs)) == 16
    assert specs[0].run_dir("runs", "cpu") == Path("runs/a/cpu-lr0.0005-wf0.05-seed1")
    assert RunSpec("a", Setting(), 3).run_dir("runs", "cpu") == Path("runs/a/cpu-seed3")  # as plain make train


def test_validation_picks_by_mean_over_seeds_and_a_setting_with_a_diverged_seed_is_not_picked():
    sel = select(
        "postnorm-12l",
        outcomes(
            "postnorm-12l",
            {
                (5e-4, 0.2): [5.40, 5.42, 5.41],
                (1e-3, 0.2): [5.30, 5.50, 5.34],  # mean 5.38: best by mean, not by its best seed
                (2e-3, 0.2): [5.10, None, 5.12],  # lowest losses, but one seed diverged
            },
        ),
    )
    assert sel.chosen.setting == Setting(1e-3, 0.2)
    assert sel.chosen.mean == pytest.approx(5.38)
    assert sel.lr_edge is None  # 1e-3 lies inside the grid
    assert sel.scores[-1].setting.lr == 2e-3 and math.isinf(sel.scores[-1].mean)


def test_lr_at_the_edge_of_the_grid_is_flagged():
    low = select("x", outcomes("x", {(5e-4, 0.2): [5.0], (1e-3, 0.2): [5.2], (2e-3, 0.2): [5.4]}))
    high = select("x", outcomes("x", {(5e-4, 0.2): [5.4], (1e-3, 0.2): [5.2], (2e-3, 0.2): [5.0]}))
    assert low.lr_edge == "lowest" and high.lr_edge == "highest"
    assert select("x", outcomes("x", {(1e-3, 0.2): [5.0], (1e-3, 0.05): [5.1]})).lr_edge is None  # one lr: no edge


def test_a_warmup_at_the_edge_is_flagged_and_each_axis_is_read_along_the_chosen_row():
    # a 2-D grid as swept in stages: every lr at warmup 0.2, then two lrs at 0.4 and one at 0.8
    grid = {
        (5e-4, 0.2): [5.6],
        (1e-3, 0.2): [5.3],
        (2e-3, 0.2): [6.4],
        (4e-3, 0.2): [6.4],
        (1e-3, 0.4): [5.2],
        (2e-3, 0.4): [5.1],
    }
    top = select("x", outcomes("x", grid))
    assert top.chosen.setting == Setting(2e-3, 0.4)
    assert top.lr_edge == "highest"  # the highest lr run at warmup 0.4, though not of the whole grid
    assert top.warmup_edge == "highest"
    inside = select("x", outcomes("x", {**grid, (4e-3, 0.4): [6.4], (2e-3, 0.8): [5.3]}))
    assert inside.chosen.setting == Setting(2e-3, 0.4) and inside.lr_edge is None and inside.warmup_edge is None
    low = select("x", outcomes("x", {(1e-3, 0.1): [5.0], (1e-3, 0.2): [5.1]}))
    assert low.warmup_edge == "lowest" and low.lr_edge is None  # one lr at that warmup: no lr edge
    assert select("x", outcomes("x", {(1e-3, None): [5.0], (2e-3, None): [5.1]})).warmup_edge is None


def test_the_runner_up_gets_seeds_only_when_within_the_seed_spread():
    close = select("x", outcomes("x", {(1e-3, 0.2): [5.00, 5.10, 4.90], (2e-3, 0.2): [5.05]}))
    assert close.confirm == [Setting(1e-3, 0.2), Setting(2e-3, 0.2)]  # 0.05 apart, spread 0.1
    far = select("x", outcomes("x", {(1e-3, 0.2): [5.00, 5.01, 4.99], (2e-3, 0.2): [5.30]}))
    assert far.confirm == [Setting(1e-3, 0.2)]
    nothing = select("x", outcomes("x", {(1e-3, 0.2): [None]}))
    assert nothing.chosen is None and nothing.confirm == []


def test_not_learning_is_apart_from_diverged():
    unigram = 6.40
    spec = RunSpec("x", Setting(), 1)
    assert RunOutcome(spec, 6.35).not_learning(unigram)  # within 0.1 nats of the unigram level
    assert RunOutcome(spec, 6.90).not_learning(unigram)  # worse than unigram
    assert not RunOutcome(spec, 6.25).not_learning(unigram)  # learned something beyond frequencies
    assert not RunOutcome(spec, None, diverged=True).not_learning(unigram)  # diverged is its own verdict


class ScriptedTrainer:
    """Stands in for compare's SweepTrainer: 'training' a run writes its eval.json with a scripted loss."""

    def __init__(self, root: Path, profile: str, loss) -> None:
        self.root, self.profile, self.loss, self.trained = str(root), profile, loss, []

    def plan(self, specs, what, training=True):
        from resnorm_lm.train.runs import RunDir

        return [s for s in specs if RunDir(s.run_dir(self.root, self.profile)).state() != "finished"]

    def train_all(self, specs):
        for spec in specs:
            run_dir = spec.run_dir(self.root, self.profile)
            run_dir.mkdir(parents=True, exist_ok=True)
            loss = self.loss(spec.setting.lr, spec.seed)
            split = {"loss": loss, "ppl": math.exp(loss), "bpb": loss / math.log(2)}
            summary = {"finished": True, "step": 1, "eval": {"step": 1, "validation": split, "test": split}}
            (run_dir / "eval.json").write_text(json.dumps(summary))
            self.trained.append(spec)


def test_the_sweep_runs_until_the_pick_has_every_seed_and_a_short_pick_is_flagged(tmp_path):
    """Extra seeds are worse everywhere, so each round's pick falls back behind a one-seed setting: the pick
    moves once per grid setting, more rounds than a fixed cap allowed (it ended on a one-seed pick)."""
    from resnorm_lm.analysis.sweep import recipe_row, run_sweep

    lrs = [1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3]
    trainer = ScriptedTrainer(tmp_path, "smoke", lambda lr, seed: 1.0 + lr * 10 + (1.0 if seed > 1 else 0.0))
    args = SimpleNamespace(
        recipes=["prenorm-12l"],
        lrs=lrs,
        warmups=None,
        grid_seeds=[1],
        seeds=[1, 2, 3],
        no_train=False,
        root=str(tmp_path),
        depths=None,
        lrs_at={},
        eval_precision="run",
    )
    selections, runs = run_sweep(args, "smoke", trainer)
    chosen = selections[Arm("prenorm-12l")].chosen
    assert chosen.setting.lr == 1e-3 and len(chosen.losses) == 3
    assert len(trainer.trained) == len(lrs) * 3  # every setting got its seeds, one round each
    assert recipe_row(selections[Arm("prenorm-12l")], runs, None, seeds_wanted=3)["status"] == "ok"

    args.no_train, args.root = True, str(tmp_path / "grid-only")  # only the grid's seed 1 exists: nothing to train
    grid_only = ScriptedTrainer(tmp_path / "grid-only", "smoke", trainer.loss)
    grid_only.train_all([s for s in runs if s.seed == 1])
    selections, runs = run_sweep(args, "smoke", grid_only)
    row = recipe_row(selections[Arm("prenorm-12l")], runs, None, seeds_wanted=3)
    assert row["n_seeds"] == 1 and row["status"] == "ok; pick has 1 of 3 seeds"


def test_a_table_row_only_reads_and_the_picks_are_tested_before(tmp_path, monkeypatch):
    """Building a row measures nothing, even where a checkpoint is there to measure: the test split is evaluated
    at the picks, and only there, before the rows are built (``ensure_picks_tested``)."""
    from resnorm_lm.analysis import sweep as eval_records
    from resnorm_lm.analysis.sweep import recipe_row

    calls = []
    monkeypatch.setattr(eval_records, "evaluate_paths", lambda paths, splits, **kw: calls.append((paths, splits)))
    runs = {}
    for lr, seed, loss in ((1e-3, 1, 5.0), (1e-3, 2, 5.2), (2e-3, 1, 5.5)):
        spec = RunSpec("prenorm-12l", Setting(lr, 0.33), seed)
        run_dir = spec.run_dir(str(tmp_path), "smoke")
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"the final weights")
        evaluation = {"step": 6, "validation": {"loss": loss}, "precision": "32-true", "trained_precision": "32-true"}
        (run_dir / "eval.json").write_text(json.dumps({"finished": True, "step": 6, "eval": evaluation}))
        runs[spec] = run_dir
    sel = select("prenorm-12l", [eval_records.outcome(spec, d) for spec, d in runs.items()])
    row = recipe_row(sel, runs, None, seeds_wanted=2)
    assert not calls and row["val_loss_mean"] == pytest.approx(5.1) and row["test_loss_mean"] is None
    eval_records.ensure_picks_tested([sel], runs)
    picked = [str(d) for s, d in runs.items() if s.setting.lr == 1e-3]
    assert calls == [(picked, ["test"])]  # the two seeds at the pick, not the other setting


def test_unigram_reference_is_the_cross_entropy_of_train_frequencies():
    train = np.array([0, 0, 0, 1, 2, 2], dtype=np.uint16)
    val = np.array([3, 0, 2, 1], dtype=np.uint16)  # targets: 0, 2, 1 (the first token predicts nothing)
    prepared = SimpleNamespace(manifest=SimpleNamespace(vocab_size=4), tokens=lambda s: {"train": train, "v": val}[s])
    # add-one counts 4, 2, 3, 1 over 10
    want = -(math.log(4 / 10) + math.log(3 / 10) + math.log(2 / 10)) / 3
    assert unigram_cross_entropy(prepared, "v") == pytest.approx(want)


def test_cost_estimate():
    assert estimate_seconds([0.5] * 10, 500, jobs=1) == 2500
    assert estimate_seconds([0.5] * 10, 500, jobs=4) == 750  # 3 rounds of 4
    # mixed depths: the slowest first, each round as long as its slowest: (2.0, 2.0) then (0.5, 0.5) then (0.5)
    assert estimate_seconds([0.5, 2.0, 0.5, 2.0, 0.5], 100, jobs=2) == 100 * (2.0 + 0.5 + 0.5)
    assert estimate_seconds([0.5, None], 500, jobs=1) is None and estimate_seconds([], 500, jobs=1) == 0


def test_untied_embeddings_have_their_own_head():
    cfg = dict(vocab_size=50, block_size=8, n_layer=2, n_head=2, n_embd=16)
    tied, untied = GPT(GPTConfig(**cfg)), GPT(GPTConfig(**cfg, tie_embeddings=False))
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_parameters() == tied.num_parameters() + 50 * 16
    _, loss = untied(torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8)))
    loss.backward()
    assert untied.lm_head.weight.grad is not None and untied.wte.weight.grad is not None


@pytest.mark.training
def test_a_tiny_sweep_interrupted_then_finished_picks_on_validation_and_tests_only_the_pick(
    tmp_path, fits_in_this_process
):
    corpus = write_learnable_corpus(tmp_path / "corpus")
    # interrupted: every grid run stops a third of the way (as if the machine went away)
    first = tiny_sweep(tmp_path, corpus, train_args=f"--run.stop_after_steps={TINY_SWEEP_STEPS // 3}")
    assert first.returncode == 1, first.stderr[-3000:]
    assert "compare: grid: 2 runs, 0 finished, 2 to train" in first.stdout
    assert "no finished runs to compare" in first.stderr
    second = tiny_sweep(tmp_path, corpus)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "compare: grid: 2 runs, 0 finished, 2 to train (2 to resume)" in second.stdout
    assert second.stdout.count("compare: resuming prenorm-12l") == 2
    runs = tmp_path / "runs" / "prenorm-12l"
    grid = list(csv.DictReader((tmp_path / "results" / "smoke" / "grid.csv").open()))
    assert {(float(g["lr"]), float(g["warmup"])) for g in grid} == {(1e-5, 0.33), (3e-3, 0.33)}
    best = min(grid, key=lambda g: float(g["val_loss_mean"]))
    assert best["chosen"] == "True" and float(best["lr"]) == 3e-3
    stuck = next(g for g in grid if float(g["lr"]) == 1e-5)
    assert stuck["status"].startswith("not learning")  # lr 1e-5 for so few steps stays at the unigram level
    table = list(csv.DictReader((tmp_path / "results" / "smoke" / "compare.csv").open()))
    assert len(table) == 1 and float(table[0]["lr"]) == 3e-3 and table[0]["n_seeds"] == "2"
    assert table[0]["status"] == "ok" and float(table[0]["val_loss_mean"]) < float(table[0]["unigram_loss"]) - 0.1
    assert table[0]["lr_edge"] == "highest" and "(highest of grid)" in second.stdout
    assert table[0]["warmup_edge"] == ""  # one warmup: no edge
    assert table[0]["init"] == "gpt2" and "Init: `gpt2` in every run" in second.stdout
    assert float(table[0]["test_loss_mean"]) > 0
    for run_dir in runs.iterdir():  # test evaluated at the chosen setting only
        evaluation = json.loads((run_dir / "eval.json").read_text())["eval"]
        assert ("test" in evaluation) == ("lr0.003" in run_dir.name), run_dir.name
    assert sorted(p.name for p in runs.iterdir()) == [
        "smoke-lr0.003-wf0.33-seed1",
        "smoke-lr0.003-wf0.33-seed2",
        "smoke-lr1e-05-wf0.33-seed1",
    ]
    tuned = tmp_path / "results" / "smoke" / "tuned" / "prenorm-12l.yaml"  # the pick, ready for recipes/tuned/
    optim = {"lr": 3e-3, "schedule": "cosine", "warmup_fraction": 0.33}
    assert yaml.safe_load(tuned.read_text()) == {"model": {"optim": optim}}
    assert "lr 0.003, warmup 0.33, 2 seed(s)" in tuned.read_text() and "<- chosen" in tuned.read_text()
    plots = ("lr_sensitivity.png", "loss_curves.png", "grad_norms.png", "clipping.png", "stream_rms.png")
    for plot in (*plots, "attention_logits.png"):
        assert (tmp_path / "results" / "smoke" / plot).stat().st_size > 10_000, plot
    at_pick = [json.loads((runs / f"smoke-lr0.003-wf0.33-seed{k}/eval.json").read_text())["clip"] for k in (1, 2)]
    assert all(c["steps"] == TINY_SWEEP_STEPS and c["max_norm"] == 1.0 for c in at_pick)
    assert float(best["clipped_mean"]) == pytest.approx(sum(c["clipped_fraction"] for c in at_pick) / 2)
    third = tiny_sweep(tmp_path, corpus)  # everything finished: nothing trained or evaluated again
    assert third.returncode == 0 and "compare: training" not in third.stdout and "resuming" not in third.stdout
    assert "nothing to train" in third.stdout
    # --no-train with a wider grid: says what is missing, trains nothing and promises no time
    fourth = tiny_sweep(tmp_path, corpus, "--lrs", "1e-5", "1e-3", "3e-3", "--no-train")
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    said = "compare: grid: 3 runs, 2 finished, 1 to train (0 to resume); not training them (--no-train)"
    assert said in fourth.stdout
    assert "compare: training" not in fourth.stdout and not (runs / "smoke-lr0.001-wf0.33-seed1").exists()
    # checkpoints deleted to save disk (or left on the machine that trained the sweep): results still stand
    for ckpt in runs.glob("*/checkpoints/*.ckpt"):
        ckpt.unlink()
    fifth = tiny_sweep(tmp_path, corpus, "--no-train")
    assert fifth.returncode == 0, fifth.stderr[-3000:]
    assert "compare: grid: 2 runs, 2 finished, 0 to train" in fifth.stdout
    assert list(csv.DictReader((tmp_path / "results" / "smoke" / "compare.csv").open())) == table
    # a split that was never evaluated needs the weights: a clear error, nothing retrained in silence
    summary_path = runs / "smoke-lr0.003-wf0.33-seed1" / "eval.json"
    summary = json.loads(summary_path.read_text())
    del summary["eval"]["test"]
    summary_path.write_text(json.dumps(summary))
    sixth = tiny_sweep(tmp_path, corpus)
    assert sixth.returncode != 0 and "checkpoints are gone" in sixth.stderr, sixth.stderr[-2000:]
    assert "smoke-lr0.003-wf0.33-seed1" in sixth.stderr and "compare: training" not in sixth.stdout


def wait_until_free(run: Path, seconds: float) -> None:
    """Wait at most ``seconds`` until no process holds the run's lock (its fit has ended); fail if one still does."""
    deadline = time.monotonic() + seconds
    while True:
        with (run / ".lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{run} is still being trained"
        time.sleep(0.2)


@pytest.mark.training
@pytest.mark.parametrize(
    "jobs, stop", [(1, signal.SIGINT), (2, signal.SIGTERM), (2, signal.SIGKILL)], ids=["ctrl-c", "kill", "kill-9"]
)
def test_a_stopped_compare_saves_its_runs_at_a_step_and_starts_no_other(tmp_path, jobs, stop):
    """Ctrl-C or ``kill`` to a local compare: its runs in training save last.ckpt at the end of their step and
    stop, the run not yet started never starts, and compare exits with 128 + the signal once they have, its runs
    left unfinished for the same command to resume. After ``kill -9`` the kernel stops the runs the same way."""
    corpus = write_learnable_corpus(tmp_path / "corpus")
    argv = [
        sys.executable,
        "-m",
        "resnorm_lm",
        "compare",
        "--recipes",
        "prenorm-12l",
        "--profile",
        "smoke",
        "--lrs",
        "1e-3",
        "2e-3",
        "3e-3",
        "--warmups",
        "0.33",
        "--seeds",
        "1",
        "--jobs",
        str(jobs),
        "--root",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
        "--train-args",
        f"--data.corpus=text --data.files=[{corpus}] --data.cache_dir={tmp_path / 'cache'} "
        "--trainer.enable_progress_bar=false --trainer.max_steps=100000 "
        "--run.checkpoint_every=1",
    ]
    runs = [tmp_path / "runs" / "prenorm-12l" / f"smoke-lr{lr}-wf0.33-seed1" for lr in ("0.001", "0.002", "0.003")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    compare = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint
    )
    try:
        deadline = time.monotonic() + 240
        while sum((run / "checkpoints" / "last.ckpt").is_file() for run in runs) < jobs:  # training: a step done
            assert compare.poll() is None and time.monotonic() < deadline, compare.communicate()[0][-3000:]
            time.sleep(0.2)
        compare.send_signal(stop)
        out = compare.communicate(timeout=120)[0]
    finally:
        if compare.poll() is None:
            compare.kill()
    started, never = runs[:jobs], runs[jobs:]
    if stop == signal.SIGKILL:
        assert compare.returncode == -signal.SIGKILL, out[-3000:]
    else:
        assert compare.returncode == 128 + stop, out[-3000:]
        assert f"compare: stopped by {signal.Signals(stop).name}; run the same command again" in out, out[-3000:]
    for run in started:
        wait_until_free(run, 60 if stop == signal.SIGKILL else 0)  # else compare waited for its fits
        summary = json.loads((run / "eval.json").read_text())
        assert summary["preempted"] is True and summary["finished"] is False, out[-3000:]
        saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
        assert saved == summary["step"] > 0  # saved at the step it stopped at, not only the periodic one
    assert not any(run.exists() for run in never), out[-3000:]


@pytest.mark.parametrize("who", ["compare", "suite"])
def test_a_stop_is_passed_on_and_named_by_the_command_that_got_it(who, tmp_path, capfd):
    """A SIGTERM while a fit runs: the fit gets it, the command exits with 143, and every line it says names the
    command that was stopped (a suite's stop once said "compare")."""
    import threading

    from resnorm_lm.analysis.launchers import RunningFits

    fits, up = RunningFits(who), tmp_path / "fit-started"

    def stop_once_the_fit_runs() -> None:  # a stop before the fit started would start none (another test's case)
        deadline = time.monotonic() + 60
        while not up.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    fit = [sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(up)!r}).touch(); time.sleep(60)"]
    stopper = threading.Thread(target=stop_once_the_fit_runs)
    started = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        with fits.stoppable():
            stopper.start()
            code = fits.run(fit)
    stopper.join()
    assert stopped.value.code == 128 + signal.SIGTERM and code == -signal.SIGTERM
    assert time.monotonic() - started < 30  # the fit stopped on the signal, not at its end
    said = capfd.readouterr().err
    assert f"{who}: SIGTERM: 1 run(s) in training save last.ckpt" in said, said
    assert f"{who}: stopped by SIGTERM; run the same command again to resume it" in said, said
    other = {"compare": "suite", "suite": "compare"}[who]
    assert f"{other}:" not in said, said


def test_parallel_compare_prepares_the_data_once_before_the_jobs_start(tmp_path, monkeypatch, capsys):
    """JOBS=2 on a cold cache: the data the runs resolve to (profile, recipe and --train-args) is prepared
    in compare itself, once, before any job starts, so the jobs do not all build it at once."""
    from resnorm_lm.analysis import launchers as sweep_runner
    from resnorm_lm.analysis.launchers import RunningFits
    from resnorm_lm.data import datamodule

    corpus, cache = write_learnable_corpus(tmp_path / "corpus", n_files=6, words_per_file=100), tmp_path / "cache"
    events = []
    real_prepare = datamodule.prepare
    monkeypatch.setattr(datamodule, "prepare", lambda *a, **k: events.append("prepare") or real_prepare(*a, **k))

    def job(self, cmd, **kwargs):  # a training job: sees how many prepared corpora the cache holds when it starts
        events.append(("job", len(list(cache.glob("prepared/*/manifest.json")))))
        return 0

    monkeypatch.setattr(RunningFits, "run", job)
    extra = ["--data.corpus=text", f"--data.files=[{corpus}]", f"--data.cache_dir={cache}", "--data.vocab_size=300"]
    trainer = sweep_runner.SweepTrainer("smoke", str(tmp_path / "runs"), extra, jobs=2)
    specs = expand_grid(["prenorm-12l", "postnorm-12l"], grid_settings([1e-3, 3e-3], None), [1])
    trainer.train_all(specs)
    assert events == ["prepare"] + [("job", 1)] * 4  # one corpus, prepared once, before every job
    (manifest,) = cache.glob("prepared/*/manifest.json")
    assert json.loads(manifest.read_text())["tokenizer_settings"]["vocab_size"] == 300  # the jobs' own settings
    assert "compare: preparing the data before the 2 parallel jobs start" in capsys.readouterr().out
    trainer.train_all(specs[:2])  # a later round: prepared already
    assert events.count("prepare") == 1 and len(events) == 7


@pytest.mark.parametrize(
    ("recipe", "profile", "extra", "expected"),
    [
        ("prenorm-12l", "smoke", [], {"vocab_size": 512, "block_size": 32}),  # the profile's
        (
            "deepnorm-24l",
            "gpu",
            ["--data.vocab_size=1024", "--data.batch_size", "8"],
            {"vocab_size": 1024, "batch_size": 8},
        ),
        (
            "postnorm-12l-nowarmup",
            "cpu",
            [
                "--data.corpus=text",
                "--data.files=[a/*.txt]",
                "--config",
                "EXTRA",
                "--data.seed=7",
                "--trainer.max_steps=3",
            ],
            {"corpus": "text", "files": ["a/*.txt"], "seed": 7, "block_size": 48},
        ),
    ],
)
def test_the_data_compare_prepares_is_the_data_print_config_resolves(
    recipe, profile, extra, expected, tmp_path, capsys
):
    """compare prepares its jobs' data from ``data_settings``, which reads the fit command's config files and
    --data options without building the CLI: the real CLI's --print_config is the reference."""
    from resnorm_lm.analysis.launchers import data_settings

    config = tmp_path / "extra.yaml"  # a later --config: its data section wins over the profile's, then --data.seed
    config.write_text(yaml.safe_dump({"data": {"seed": 5, "block_size": 48}, "trainer": {"max_steps": 4}}))
    extra = [str(config) if arg == "EXTRA" else arg for arg in extra]
    assert run_cli(["fit", "--recipe", recipe, "--profile", profile, *extra, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["data"]
    assert data_settings(recipe, profile, extra) == printed == {**printed, **expected}
    assert data_settings(recipe, profile, [*extra, "--data.vocab_size=many"]) is None  # as the CLI refuses it


@pytest.mark.training
def test_compare_hardware_pairs_the_same_runs_of_two_machines(tmp_path):
    def run(root: str, name: str, loss: float | None, diverged: bool = False) -> None:
        d = tmp_path / root / "prenorm-12l" / name
        d.mkdir(parents=True)
        ev = {"eval": {"validation": {"loss": loss}}} if loss is not None else {}
        (d / "eval.json").write_text(json.dumps({"diverged": diverged, **ev}))

    for name, a, b in (
        ("cpu-lr0.001-wu200-seed1", 5.30, 5.31),
        ("cpu-lr0.002-wu200-seed1", 5.10, 5.07),
        ("cpu-lr0.004-wu200-seed1", 6.42, 5.40),
    ):
        run("one", name, a)
        run("two", name, b)
    run("one", "cpu-lr0.008-wu200-seed1", 5.0)  # only on one machine: not a pair
    proc = subprocess.run(
        [sys.executable, "benchmarks/compare_hardware.py", str(tmp_path / "one"), str(tmp_path / "two")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "cpu-lr0.008" not in proc.stdout and "+1.020" not in proc.stdout and "-1.020" in proc.stdout
    assert "2 pairs where both learn: |diff| median 0.0200, largest 0.0300 nats" in proc.stdout


@pytest.mark.training
def test_compare_hardware_pairs_a_suites_runs_by_their_own_validation_and_one_source_a_pair(tmp_path):
    def run(root: str, name: str, trained: float, evaluated: float | None = None) -> None:
        d = tmp_path / root / "placements-12l" / "run-files" / "prenorm-12l" / name
        d.mkdir(parents=True)
        ev = {"eval": {"validation": {"loss": evaluated}}} if evaluated is not None else {}
        (d / "eval.json").write_text(json.dumps({"diverged": False, "val_loss": trained, **ev}))

    run("suites", "cpu-lr0.004-wf0.25-seed1", 5.03)  # a suite's runs: eval.json's val_loss alone
    run("suites-h100", "cpu-lr0.004-wf0.25-seed1", 5.02)
    run("suites", "cpu-lr0.008-wf0.25-seed1", 5.10, evaluated=5.00)  # evaluated on one side only: trained both
    run("suites-h100", "cpu-lr0.008-wf0.25-seed1", 5.06)
    roots = [str(tmp_path / r / "placements-12l" / "run-files") for r in ("suites", "suites-h100")]
    proc = subprocess.run(
        [sys.executable, "benchmarks/compare_hardware.py", *roots], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:3] == ["run", "suites", "suites-h100"]  # the roots told apart by where they differ
    assert "-0.040" in proc.stdout and "+0.060" not in proc.stdout
    assert "2 pairs where both learn: |diff| median 0.0250, largest 0.0400 nats" in proc.stdout


@pytest.mark.training
def test_compare_hardware_names_the_machines_and_draws_every_pair(tmp_path):
    from PIL import Image

    for root, losses in (("a", (5.03, 5.10, None)), ("b", (5.02, 6.40, 5.2))):  # the third diverged on a only
        for lr, loss in zip(("0.004", "0.008", "0.016"), losses):
            d = tmp_path / root / "prenorm-12l" / f"cpu-lr{lr}-wf0.25-seed1"
            d.mkdir(parents=True)
            (d / "eval.json").write_text(json.dumps({"diverged": loss is None, "val_loss": loss}))
    figure = tmp_path / "pairs.png"
    argv = [str(tmp_path / "a"), str(tmp_path / "b"), "--names", "EPYC", "H100", "--plot", str(figure)]
    proc = subprocess.run(
        [sys.executable, "benchmarks/compare_hardware.py", *argv], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:3] == ["run", "EPYC", "H100"]
    assert "1 pairs where both learn" in proc.stdout  # 6.40 is within the not-learning margin of 6.401
    assert f"wrote {figure}" in proc.stdout and Image.open(figure).size[0] > 400
