"""The GPU session (benchmarks/gpu_session.py): its pieces, and a dry run of every stage on the CPU.

The dry run (``--dry-run``) runs each stage's children at tiny sizes (the smoke profile, a generated corpus, no
network); CUDA-only steps run their CPU path and report "skipped: no CUDA". Each dry-run test checks that what
lands under $OUT would all come back from the device (benchmarks/device_files.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from benchmarks import bench_training, gpu_session, run_files
from benchmarks.device_files import layout_problems

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the driver's pieces


def session(tmp_path, dry: bool = True, compare_args=(), suite_args=()) -> gpu_session.Session:
    return gpu_session.Session(
        out=tmp_path / "out",
        scratch=tmp_path / "scratch",
        dry=dry,
        runs_root=tmp_path / "runs",
        seed_dir=tmp_path / "seed",
        e2e_steps=4,
        kernel_widths=[64],
        compare_args=list(compare_args),
        suite_args=list(suite_args),
    )


def test_a_step_is_ok_failed_or_skipped_without_cuda_and_a_failure_does_not_stop_the_session(tmp_path):
    s = session(tmp_path)
    ok = s.step("st", "ok", [sys.executable, "-c", "print('hello')"], 30)
    failed = s.step("st", "bad", [sys.executable, "-c", "raise SystemExit(3)"], 30)
    no_cuda = s.step("st", "gpu", [sys.executable, "-c", "print('skipped: no CUDA')"], 30, needs_cuda=True)
    no_time = s.step("st", "late", [sys.executable, "-c", "print('never')"], 5)
    assert [ok.status, failed.status] == ["ok", "failed (exit 3)"]
    assert no_cuda.status == "skipped: no CUDA (its CPU plumbing ran)"
    assert no_time.status == "skipped: 5 s left of the budget" and s.failed == 1
    assert s.lines[0].startswith("st/ok: ok (") and s.lines[1].startswith("st/bad: failed (exit 3)")


def carried_run(root: Path, recipe: str, run: str, reference: str) -> Path:
    """A finished run as a carried tarball unpacks it, computed where the reference fingerprint is ``reference``."""
    run_dir = root / recipe / run
    run_dir.mkdir(parents=True)
    (run_dir / "eval.json").write_text(json.dumps({"finished": True, "val_loss": 5.0}))
    segment = {"arithmetic": {"fingerprint": {"version": 1, "reference": reference, "model": "m"}}}
    (run_dir / "manifest.json").write_text(json.dumps({**segment, "segments": [segment]}))
    return run_dir


def test_carried_runs_of_another_gpus_arithmetic_are_set_aside_and_this_gpus_kept(tmp_path, capsys):
    """An H200 lent where the carried runs are an H100's: they leave the suite's root (its table is this GPU's
    own), the runs of this GPU's arithmetic stay; without CUDA (the dry run) nothing is probed or moved."""
    s = session(tmp_path)
    root = tmp_path / "runs" / "suites" / "placements-12l"
    h100 = carried_run(root, "prenorm-12l", "cpu-lr0.001-wf0.25-seed0", "h100")
    mine = carried_run(root, "prenorm-12l", "cpu-lr0.002-wf0.25-seed0", "h200")
    assert gpu_session.device_reference(s, "placements-12l") is None  # no CUDA here: no probe
    gpu_session.set_aside_other_arithmetic(s, root, None)
    assert h100.is_dir() and capsys.readouterr().out == ""
    gpu_session.set_aside_other_arithmetic(s, root, "h200")
    said = capsys.readouterr().out
    assert "1 carried run(s) of placements-12l computed in another arithmetic (h100 (1)) than this GPU's (h200)" in said
    assert not h100.exists() and mine.is_dir() and run_files.finished_runs(root) == [mine]
    aside = root.with_name("placements-12l.other-arithmetic") / "prenorm-12l" / "cpu-lr0.001-wf0.25-seed0"
    assert (aside / "manifest.json").is_file()


GRANDCHILD = """
import signal, subprocess, sys, time
saver = '''
import signal, sys, time, pathlib
def save(*_):
    pathlib.Path(sys.argv[1]).write_text("saved on SIGTERM")
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
print("training", flush=True)
time.sleep(60)
'''
subprocess.run([sys.executable, "-c", saver, sys.argv[1]])  # as compare runs each fit
"""


@pytest.mark.training
def test_a_step_past_its_budget_stops_its_whole_process_group_and_waits_for_checkpoints(tmp_path, monkeypatch):
    """A step past its budget: every process of its group gets SIGTERM (here a child's child, which then saves),
    and the step waits for them before the next one starts. (compare's fits train in groups of their own:
    compare passes its SIGTERM on and waits for them, tests/test_sweep.py.)"""
    monkeypatch.setattr(gpu_session, "MIN_STEP_S", 1)
    s = session(tmp_path)
    marker = tmp_path / "saved.txt"
    t0 = time.monotonic()
    result = s.step("depth", "sweep", [sys.executable, "-c", GRANDCHILD, str(marker)], 3, grace_s=10)
    assert result.status == "cut at its 3 s budget" and time.monotonic() - t0 < 20
    assert marker.read_text() == "saved on SIGTERM"  # the grandchild had its SIGTERM and finished saving


def test_depth_takes_compares_arguments_and_adds_the_root_results_and_this_machines_training_arguments(tmp_path):
    s = session(
        tmp_path,
        dry=False,
        compare_args=[
            "--recipes",
            "prenorm-12l",
            "--depths=48",
            "--lrs",
            "1e-3",
            "--train-args",
            "--trainer.max_steps=10",
        ],
    )
    args = gpu_session.compare_arguments(s)
    assert args[:6] == ["--recipes", "prenorm-12l", "--depths", "48", "--lrs", "1e-3"]
    assert args[args.index("--profile") + 1] == "cpu" and args[args.index("--jobs") + 1] == "12"
    assert args[args.index("--root") + 1] == str(tmp_path / "runs")
    train = "--trainer.accelerator=gpu --trainer.precision=32-true --trainer.enable_progress_bar=false"
    assert args[args.index("--train-args") + 1] == f"{train} --trainer.max_steps=10"
    assert args.count("--train-args") == 1
    for bad in (["--root", "x"], ["--results=x"]):
        with pytest.raises(SystemExit, match="sets --r"):
            gpu_session.compare_arguments(session(tmp_path, dry=False, compare_args=["--recipes", "a", *bad]))
    with pytest.raises(SystemExit, match="give compare's arguments after --"):
        gpu_session.compare_arguments(session(tmp_path, dry=False))


def test_the_command_line_refuses_what_cannot_work(capsys):
    parse = gpu_session.parse_args
    eight = ["quick", "check", "kernels", "training", "placements", "e2e", "profile", "depth"]
    for argv, says in (
        (["prepare", "quick"], "give it alone"),
        (["quick", "--", "--recipes", "x"], "for the depth"),
        (["depth", "suite", "--", "placements-12l"], "give them in two commands"),
        (eight, "at most 7 stages"),
        (["quick", "quick"], "named twice"),
        (["nope"], "invalid choice"),
    ):
        with pytest.raises(SystemExit):
            parse(argv)
        assert says in capsys.readouterr().err
    args = parse(["--dry-run", "depth", "--", "--recipes", "prenorm-12l", "--seeds", "1"])
    assert args.stages == ["depth"] and args.compare_args == ["--recipes", "prenorm-12l", "--seeds", "1"]
    args = parse(["quick", "suite", "--", "placements-12l", "--jobs", "6"])
    assert args.suite_args == ["placements-12l", "--jobs", "6"] and args.compare_args == []


def test_suite_takes_a_suites_name_and_jobs_and_refuses_a_missing_name_before_any_stage_runs(tmp_path, capsys):
    assert gpu_session.suite_arguments(session(tmp_path, dry=False, suite_args=["placements-12l"])) == (
        ["placements-12l"],
        12,
        [],
    )
    assert gpu_session.suite_arguments(session(tmp_path, suite_args=["placements-12l", "--jobs", "2"]))[1] == 2
    assert gpu_session.suite_arguments(session(tmp_path)) == ([None], 1, [])  # the dry run's tiny suite
    several = ["placements-12l", "designs-12l", "--jobs", "6", "--reuse", "placements-12l"]
    assert gpu_session.suite_arguments(session(tmp_path, suite_args=several)) == (several[:2], 6, ["placements-12l"])
    for suite_args, says in (
        ([], "give the suite's name after --"),
        (["nope"], "'nope': a suite of recipes/"),
        (["placements-12l", "nope"], "'nope': a suite of recipes/"),
        (["placements-12l", "placements-12l"], "a suite named twice"),
        (["designs-12l", "--reuse", "nope"], "'nope': a suite of recipes/"),
    ):
        with pytest.raises(SystemExit, match=says):
            gpu_session.suite_arguments(session(tmp_path, dry=False, suite_args=suite_args))
    with pytest.raises(SystemExit):
        gpu_session.suite_arguments(session(tmp_path, suite_args=["placements-12l", "--root", "x"]))
    assert "unrecognized arguments: --root x" in capsys.readouterr().err
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="give the suite's name"):
        gpu_session.main(["quick", "suite", "--out", str(out), "--scratch", str(tmp_path / "scratch")])
    assert not out.exists()  # refused before quick ran


def test_a_budget_is_shared_by_weight_among_what_is_left():
    budget = gpu_session.Budget(100)
    assert budget.share(1, 1) == pytest.approx(50, abs=1) and budget.share(3, 1) == pytest.approx(75, abs=1)
    assert gpu_session.Budget(-5).share(1) == 0


# ---------------------------------------------------------------- bench_training: failures and unknown peaks


def test_a_failed_child_leaves_its_row_empty_and_the_table_the_ratio_and_the_csv_still_come(
    tmp_path, monkeypatch, capsys
):
    def child(kind, profile, compile_, steps, warmup, timeout_s=None, data_files=None):
        if kind == "bare":
            raise bench_training.ChildFailed("bench child bare (compile=False) failed:\nTraceback ...")
        return {"starts": [0.0, 1.0, 2.0], "ends": [0.9, 1.9, 2.9], "max_rss_mb": 100.0}

    monkeypatch.setattr(bench_training, "run_child", child)
    rows = bench_training.bench_throughput("gpu", [False], 1, 3, 1)
    assert [r["tokens_per_s"] is None for r in rows] == [False, True] and rows[1]["error"].startswith("bench child")
    bench_training.print_throughput(rows, "gpu", 1, 3, 1, "no CUDA")
    out = capsys.readouterr().out
    assert "lightning_vs_bare_ratio (compile=false)=n/a (a path has no run: see its row)" in out
    assert re.search(r"bare +false +n/a +n/a +n/a", out)
    assert "MFU: left out: no CUDA" in out  # lightning has a rate but no MFU: the line says why
    bench_training.write_csv("training_gpu.csv", rows, tmp_path)
    assert [r["path"] for r in csv.DictReader((tmp_path / "training_gpu.csv").open())] == ["lightning", "bare"]


def test_the_ratio_is_the_median_of_each_rounds_paired_ratio(monkeypatch, capsys):
    """A machine that slows down for a while slows both runs of a round: the ratio of each round's pair holds
    where the ratio of the two medians would not (here: 1.000, where the medians' ratio says 0.800)."""
    speeds = iter([(1.0, 1.0), (2.0, 2.5), (2.0, 2.5), (3.0, 3.0), (3.0, 3.0)])  # (bare, lightning) s per step
    current = {}

    def child(kind, profile, compile_, steps, warmup, timeout_s=None, data_files=None):
        if kind == "lightning":
            current["bare"], current["lightning"] = next(speeds)
        step = current[kind]
        return {"starts": [0.0, step, 2 * step], "ends": [step, 2 * step, 3 * step], "max_rss_mb": 1.0}

    monkeypatch.setattr(bench_training, "run_child", child)
    rows = bench_training.bench_throughput("cpu", [False], 5, 3, 1)
    bench_training.print_throughput(rows, "cpu", 5, 3, 1)
    out = capsys.readouterr().out
    assert "lightning_vs_bare_ratio (compile=false)=1.000 (median of 5 rounds' ratios, 0.800..1.000)" in out


def test_an_unknown_peak_leaves_mfu_out_with_a_line_saying_why(capsys):
    rows = [
        {
            "path": p,
            "compile": True,
            "tokens_per_s": 1000,
            "step_s": 0.1,
            "gap_fraction": 0.0,
            "mfu": None,
            "max_rss_mb": 10,
            "paired_ratios": "1.000",
        }
        for p in ("lightning", "bare")
    ]
    reason = "Lightning's table has no dense bf16 peak for 'NVIDIA H200'"
    bench_training.print_throughput(rows, "gpu", 1, 3, 1, reason)
    out = capsys.readouterr().out
    assert "lightning_vs_bare_ratio (compile=true)=1.000 (median of 1 rounds' ratios, 1.000..1.000)" in out
    assert re.search(r"lightning +true +1000 +0.1000 +n/a", out)
    assert f"MFU: left out: {reason}" in out
    assert bench_training.no_peak_reason() == "no CUDA"  # the reason here, on a machine without CUDA


def test_the_kernel_table_forgets_autotunes_picks_before_each_case():
    import resnorm_lm.model.kernels.add_norm as kernels
    from benchmarks.bench_kernels import reset_autotune

    kernels._add_norm_fwd_tuned.cache[(768, "bf16")] = "tuned on 8 rows"
    kernels._PICKED[("fwd", 768)] = ({}, {})
    reset_autotune()
    assert kernels._add_norm_fwd_tuned.cache == {} and kernels._PICKED == {}


# ---------------------------------------------------------------- finished runs carried there and back


def fake_run(
    root: Path,
    recipe: str,
    tag: str,
    finished: bool = True,
    precision: str = "32-true",
    val_loss: float = 5.0,
    checkpoint: bool = False,
) -> Path:
    run = root / recipe / tag
    run.mkdir(parents=True)
    run.joinpath("eval.json").write_text(
        json.dumps({"finished": finished, "step": 500, "val_loss": val_loss, "eval": {"trained_precision": precision}})
    )
    run.joinpath("metrics.csv").write_text("step,train/loss\n0,6.0\n")
    run.joinpath("config.yaml").write_text(f"trainer:\n  precision: {precision}\n")
    if checkpoint:
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    return run


def test_prepare_carries_the_finished_runs_of_the_sweeps_profile_and_precision_once(tmp_path):
    a, b = tmp_path / "a" / "run-files", tmp_path / "b" / "run-files-fp32"
    fake_run(a, "prenorm-12l", "cpu-lr0.008-wu200-seed1")
    fake_run(a, "prenorm-12l", "cpu-lr0.004-wu200-seed1", precision="bf16-mixed")
    fake_run(a, "postnorm-12l", "cpu-d24-lr0.0005-wu200-seed1", finished=False)
    fake_run(a, "postnorm-12l", "gpu-seed1")
    fake_run(b, "prenorm-12l", "cpu-lr0.008-wu200-seed1")  # the same run in a second folder
    fake_run(b, "lns-12l", "cpu-d24-lr0.008-wu200-seed2")
    runs, notes = run_files.seed_runs([a, b], "cpu", "32-true")
    assert runs == {
        "lns-12l/cpu-d24-lr0.008-wu200-seed2": b / "lns-12l" / "cpu-d24-lr0.008-wu200-seed2",
        "prenorm-12l/cpu-lr0.008-wu200-seed1": a / "prenorm-12l" / "cpu-lr0.008-wu200-seed1",
    }
    assert any("trained at bf16-mixed, not 32-true" in n for n in notes)
    assert any("the same run as" in n for n in notes)


def test_runs_go_back_without_checkpoints_and_come_in_without_overwriting_a_run_already_there(tmp_path):
    root = tmp_path / "root"
    fake_run(root, "prenorm-12l", "cpu-d48-lr0.001-wu200-seed1", checkpoint=True)
    fake_run(root, "postnorm-12l", "cpu-d48-lr0.0005-wu200-seed1")
    fake_run(root, "postnorm-12l", "cpu-d48-lr0.001-wu200-seed1", finished=False, checkpoint=True)
    parts = run_files.pack_runs(root, tmp_path / "out", "depth-runs")
    assert [p.name for p in parts] == ["depth-runs-1.tar.gz"]
    with tarfile.open(parts[0]) as tar:
        names = tar.getnames()
    assert not any("ckpt" in n or "checkpoints" in n for n in names)
    assert {n.split("/")[1] for n in names} == {"cpu-d48-lr0.001-wu200-seed1", "cpu-d48-lr0.0005-wu200-seed1"}
    fresh = tmp_path / "fresh"
    kept = fake_run(fresh, "prenorm-12l", "cpu-d48-lr0.001-wu200-seed1", val_loss=4.0, checkpoint=True)
    assert run_files.unpack_runs(parts, fresh) == (1, 1)
    assert json.loads((kept / "eval.json").read_text())["val_loss"] == 4.0  # the warm machine's run stays
    assert (fresh / "postnorm-12l" / "cpu-d48-lr0.0005-wu200-seed1" / "metrics.csv").is_file()
    assert len(run_files.pack_runs(root, tmp_path / "parts", "p", part_bytes=10)) == 2  # one part per run here


def test_a_run_stopped_before_its_first_checkpoint_is_told_apart_from_one_that_failed(tmp_path):
    root = tmp_path / "root"
    done = fake_run(root, "prenorm-12l", "cpu-lr0.004-wf0.25-seed1")
    saved = fake_run(root, "prenorm-12l", "cpu-lr0.004-wf0.25-seed2", finished=False, checkpoint=True)
    failed = fake_run(root, "prenorm-12l", "cpu-lr0.004-wf0.25-seed3", finished=False)
    raised = fake_run(root, "postnorm-12l", "cpu-lr0.001-wf0.5-seed1", finished=False)
    stopped = fake_run(root, "postnorm-12l", "cpu-lr0.001-wf0.5-seed2", finished=False)
    for run in (done, saved, stopped):
        run.joinpath("train.log").write_text("Seed set to 1\nGPU available: True (cuda), used: True\n")
    failed.joinpath("train.log").write_text("Seed set to 3\nresnorm-lm: error: the data cache is corrupt\n")
    raised.joinpath("train.log").write_text("Traceback (most recent call last):\n  ...\nRuntimeError: CUDA OOM\n")
    assert run_files.failed_runs(root) == [raised, failed]
    assert run_files.stopped_runs(root) == [stopped]


def test_contributions_are_measured_best_run_of_each_depth_first_where_a_checkpoint_is_there(tmp_path):
    root = tmp_path / "root"
    best48 = fake_run(root, "prenorm-12l", "cpu-d48-lr0.001-wu200-seed1", val_loss=5.0, checkpoint=True)
    worse48 = fake_run(root, "prenorm-12l", "cpu-d48-lr0.004-wu200-seed1", val_loss=5.5, checkpoint=True)
    best96 = fake_run(root, "prenorm-12l", "cpu-d96-lr0.001-wu200-seed1", val_loss=5.2, checkpoint=True)
    fake_run(root, "prenorm-12l", "cpu-d96-lr0.002-wu200-seed1", val_loss=4.0)  # no checkpoint: cannot
    measured = fake_run(root, "lns-12l", "cpu-d48-lr0.008-wu200-seed1", checkpoint=True)
    measured.joinpath("layer_contribution.json").write_text(json.dumps({"step": 500, "tokens_asked": 128}))
    assert run_files.contribution_order(root, 128) == [best48, best96, worse48]
    assert measured in run_files.contribution_order(root, 256)  # measured on another slice: again


# ---------------------------------------------------------------- the dry runs


def dry_run(tmp_path, *argv: str, limit: int = 540) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    cmd = [
        "bash",
        "benchmarks/gpu_session.sh",
        "--dry-run",
        "--scratch",
        str(tmp_path / "scratch"),
        "--out",
        str(out),
        "--limit-s",
        str(limit),
        *argv,
    ]
    env = dict(os.environ, PY=sys.executable, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit + 60)
    return done, out


def statuses(out: Path) -> dict[str, str]:
    lines = (out / "session.txt").read_text().splitlines()
    return dict(
        re.match(r"^(\w+/[\w-]+): (.*) \(\d+ s\)$", line).groups() for line in lines if re.match(r"^\w+/[\w-]+: ", line)
    )


def members(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as tar:
        return tar.getnames()


@pytest.mark.training
def test_dry_run_of_the_quick_stage(tmp_path):
    """40-60 s on the 2-core machine under load (four children that import torch and Lightning): the one dry run
    in the fast suite, since quick is the first command whenever a GPU is lent."""
    done, out = dry_run(tmp_path, "quick")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert statuses(out) == {
        "quick/lightning-vs-bare": "ok (compile off: the dry run compiles nothing)",
        "quick/kernel-768": "skipped: no CUDA (its CPU plumbing ran)",
        "quick/triton-vs-torch": "skipped: no CUDA (its CPU plumbing ran)",
    }
    assert layout_problems(out) == []
    assert sorted(p.name for p in (out / "quick").iterdir()) == [
        "log.txt",
        "placements_smoke.csv",
        "training_smoke.csv",
    ]
    rows = list(csv.DictReader((out / "quick" / "training_smoke.csv").open()))
    assert [r["path"] for r in rows] == ["lightning", "bare"] and all(float(r["tokens_per_s"]) > 0 for r in rows)
    log = (out / "quick" / "log.txt").read_text()
    assert "lightning_vs_bare_ratio (compile=false)=" in log and "skipped: no CUDA GPU" in log
    assert "quick: lightning_vs_bare_ratio (compile=false)=" in done.stdout  # the headlines close the output


@pytest.mark.slow
def test_dry_run_of_every_other_measuring_stage_in_one_command(tmp_path):
    """80-130 s on the 2-core machine under load. Six stages and session.txt: packing has to happen."""
    done, out = dry_run(tmp_path, "check", "kernels", "training", "placements", "e2e", "profile")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = statuses(out)
    assert said["training/lightning-vs-bare"].startswith("ok")
    for step in (
        "check/gpu-tests",
        "kernels/table",
        "placements/step-times",
        "e2e/make-train",
        "profile/triton",
        "profile/torch",
    ):
        assert said[step] == "skipped: no CUDA (its CPU plumbing ran)", step
    assert layout_problems(out) == []
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert len(files) == 8 and "session.txt" in files
    packed = {name for f in files if f.endswith(".tar.gz") for name in members(out / f)}
    e2e = {f for f in files if f.startswith("e2e/")} | {f"e2e/{n}" for n in packed}
    assert {"e2e/eval.json", "e2e/metrics.csv", "e2e/manifest.json"} <= e2e  # flat, or in the stage's tarball
    assert {"summary-torch.json", "kernels-torch.txt", "trace-torch.json.gz"} <= packed | {Path(f).name for f in files}
    assert "packed into" in (out / "session.txt").read_text()


@pytest.mark.slow
def test_dry_run_of_two_depth_rounds_the_second_on_a_fresh_machine_from_the_firsts_runs(tmp_path):
    """60-85 s on the 2-core machine under load: two tiny runs, their tables and layer contribution, then a
    second round with a new runs root, which trains nothing and measures nothing again."""
    first, out = dry_run(tmp_path / "round1", "depth")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert layout_problems(out) == []
    assert sorted(p.name for p in (out / "depth").iterdir()) == [
        "compare.md",
        "depth-runs-1.tar.gz",
        "depth.md",
        "layer_contribution.md",
        "log.txt",
        "results.tar.gz",
    ]
    names = members(out / "depth" / "depth-runs-1.tar.gz")
    assert not any("ckpt" in n or "checkpoints" in n for n in names)
    assert sum(n.endswith("/eval.json") for n in names) == 2
    assert any(n.endswith("layer_contribution.json") for n in names)
    assert "| prenorm-12l | 2 |" in (out / "depth" / "layer_contribution.md").read_text()
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "depth-runs-1.tar.gz").write_bytes((out / "depth" / "depth-runs-1.tar.gz").read_bytes())
    second, out2 = dry_run(tmp_path / "round2", "--seed-dir", str(seeds), "depth")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "2 finished run(s) unpacked from 1 tarball(s)" in second.stdout
    assert "compare: grid: 2 runs, 2 finished, 0 to train" in second.stdout and "compare: training" not in second.stdout
    assert "measured 0 of 0" in second.stdout  # the pick's measurement came along in its run's files
    contribution = (out / "depth" / "layer_contribution.md").read_text()
    assert (out2 / "depth" / "layer_contribution.md").read_text() == contribution


@pytest.mark.slow
def test_dry_run_of_two_suite_chunks_the_second_on_a_fresh_machine_from_the_firsts_runs(tmp_path):
    """35-60 s on the 2-core machine under load: a tiny suite (two 4-step smoke runs) trained, its table rendered
    and its runs packed; then a second chunk with a new runs root, which unpacks them and trains nothing again."""
    first, out = dry_run(tmp_path / "chunk1", "suite")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert statuses(out) == {"suite/train-dry-suite": "ok"}
    assert layout_problems(out) == []
    assert sorted(p.name for p in (out / "suite").iterdir()) == [
        "dry-suite.md",
        "log.txt",
        "suite-dry-suite-runs-1.tar.gz",
    ]
    names = members(out / "suite" / "suite-dry-suite-runs-1.tar.gz")
    assert not any("ckpt" in n or "checkpoints" in n for n in names)
    assert {n for n in names if n.endswith(("/eval.json", "/manifest.json", "/metrics.csv"))} == {
        f"{run}/{f}"
        for run in ("prenorm-12l/smoke-lr0.003-wf0.25-seed1", "postnorm-12l/smoke-lr0.001-wf0.25-seed1")
        for f in ("eval.json", "manifest.json", "metrics.csv")
    }
    assert "suite: training" in first.stdout and "--trainer.accelerator=cpu" in first.stdout
    assert "suite dry-suite: complete" in first.stdout.split("headlines:")[1]
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "suite-dry-suite-runs-1.tar.gz").write_bytes(
        (out / "suite" / "suite-dry-suite-runs-1.tar.gz").read_bytes()
    )
    (seeds / "depth-runs-1.tar.gz").write_bytes(b"not this stage's")  # another stage's tarball: left alone
    # the second command names the same suite and a second one: the first, complete from its unpacked runs,
    # trains nothing and leaves the command's time to the next, which is offered the first's runs (--reuse) and
    # refuses them, saying why: the dry run's corpus lives in each command's own scratch folder (suite --reuse
    # takes a run only where its config is this suite's here: tests/test_suite_reuse.py)
    files = [tmp_path / "dry-suite.yaml", tmp_path / "dry-next.yaml"]
    for file in files:
        file.write_text(gpu_session.DRY_SUITE)
    argv = ["--seed-dir", str(seeds), "suite", "--", *map(str, files), "--reuse", str(files[0])]
    second, out2 = dry_run(tmp_path / "chunk2", *argv)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert statuses(out2) == {"suite/train-dry-suite": "ok", "suite/train-dry-next": "ok"}
    assert "2 finished run(s) unpacked from 1 tarball(s)" in second.stdout
    assert "suite dry-suite: 2 runs finished, 0 training, 0 more wanted now" in second.stdout
    refused = "suite dry-next: not reused (it trains here): prenorm-12l/smoke-lr0.003-wf0.25-seed1: data.files: run"
    assert refused in second.stdout and "suite dry-next: 0 finished run(s) reused from" in second.stdout
    results = [line for line in second.stdout.splitlines() if line.startswith("RESULT run=")]
    assert second.stdout.count("suite: training") == 2 and len(results) == 2  # dry-next's two runs, and only those
    assert all("/suites/dry-next/" in line for line in results)
    assert (out2 / "suite" / "dry-next.md").is_file() and (out2 / "suite" / "suite-dry-next-runs-1.tar.gz").is_file()
    assert sorted(members(out2 / "suite" / "suite-dry-suite-runs-1.tar.gz")) == sorted(names)
    table = [line for line in (out / "suite" / "dry-suite.md").read_text().splitlines() if line.startswith("|")]
    assert table and table == [
        line for line in (out2 / "suite" / "dry-suite.md").read_text().splitlines() if line.startswith("|")
    ]


@pytest.mark.training
def test_dry_run_of_prepare_carries_the_committed_fp32_runs(tmp_path):
    done = subprocess.run(
        ["bash", "benchmarks/gpu_session.sh", "--dry-run", "--prepare-dir", str(tmp_path), "prepare"],
        cwd=REPO,
        env=dict(os.environ, PY=sys.executable),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wheels and data: skipped in the dry run" in done.stdout
    assert re.search(
        r"travel: \d+\.\d of 64 MiB as a tar packs it \(the working tree \d+\.\d in \d+ files", done.stdout
    ), done.stdout[-2000:]
    names = members(tmp_path / ".devseed" / "docs-run-files.tar.gz")
    committed = run_files.seed_runs(sorted(REPO.glob("docs/results/*/run-files*")), "cpu", "32-true")[0]
    assert {"/".join(n.split("/")[:2]) for n in names} == set(committed) and committed
    assert not any("ckpt" in n for n in names)
    for folder in sorted(REPO.glob(f"{gpu_session.GPU_SUITE_RESULTS}/*/run-files")):  # each suite's GPU runs
        suite_runs = members(tmp_path / ".devseed" / f"suite-{folder.parent.name}-runs-committed-1.tar.gz")
        wanted = {f"{r.parent.name}/{r.name}" for r in run_files.finished_runs(folder)}
        assert {"/".join(n.split("/")[:2]) for n in suite_runs} == wanted and wanted


# ---------------------------------------------------------------- the docs' commands


def test_every_gpu_session_command_in_the_docs_parses_and_its_compare_and_suite_arguments_exist(tmp_path):
    docs = [REPO / "docs" / "benchmarks.md", REPO / "docs" / "depth.md"]
    lines = [
        line.strip().removeprefix("$ ")
        for doc in docs
        for line in doc.read_text().splitlines()
        if "benchmarks/gpu_session.sh" in line and line.strip().startswith("bash ")
    ]
    assert len(lines) >= 6
    for line in lines:
        argv = shlex.split(line.split("#")[0])[2:]
        args = gpu_session.parse_args(argv)
        if args.compare_args:
            assert not compare_problems(args.compare_args), (line, compare_problems(args.compare_args))
        if args.suite_args:
            assert gpu_session.suite_arguments(session(tmp_path, dry=False, suite_args=args.suite_args))[0], line


def compare_problems(argv: list[str]) -> list[str]:
    """Options of ``resnorm-lm compare`` that its own parser does not have (the parser caught as it parses)."""
    from resnorm_lm.cli import main

    caught = []

    def capture(self, *args, **kwargs):
        caught.append(self)
        raise SystemExit(0)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(SystemExit):
            main(["compare"])
    known = caught[0]._option_string_actions
    return [a for a in argv if a.startswith("--") and a.split("=")[0] not in known]


def test_travel_is_counted_as_a_tar_packs_it_and_parking_frees_the_excess_largest_first():
    # a header block, then the content in whole 512-byte blocks: what the device tool counted when it refused
    assert [gpu_session.packed_size(n) for n in (0, 1, 512, 513)] == [512, 1024, 1024, 1536]
    folders = {"docs/results/a": 5 * 2**20, "docs/results/b": 12 * 2**20, "docs/results/c": 3 * 2**20}
    assert gpu_session.parking(folders, 0) == []
    assert gpu_session.parking(folders, 2**20) == ["docs/results/b"]
    assert gpu_session.parking(folders, 13 * 2**20) == ["docs/results/b", "docs/results/a"]
    assert gpu_session.parking(folders, 30 * 2**20) == ["docs/results/b", "docs/results/a", "docs/results/c"]
    commands = gpu_session.park_commands(["docs/results/b"])
    assert "git sparse-checkout set --no-cone '/*' '!/docs/results/b/'" in commands
    assert "git sparse-checkout disable" in commands
