"""Faults: SIGKILL anywhere, SIGTERM, a dead DDP rank, killed data preparation, divergence, bad input."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from resnorm_lm.analysis.compare import markdown_report
from resnorm_lm.analysis.sweep import RunOutcome, RunSpec, Setting, grid_rows, recipe_row, select
from resnorm_lm.cli import main
from resnorm_lm.train.checkpoint_io import AtomicCheckpointIO
from resnorm_lm.train.divergence import DivergenceConfig, DivergenceGuard, LossWindow
from resnorm_lm.train.preemption import Preemption
from tests.smoke import (
    REPO,
    final_weights,
    resnorm_lm_process,
    run_cli,
    run_cli_captured,
    smoke_args,
    train_losses,
    write_corpus,
)

TOTAL = 6
COMMON = [
    "--model.arch.dropout=0.1",
    f"--trainer.max_steps={TOTAL}",
    "--run.checkpoint_every=1",
    "--trainer.val_check_interval=2",
]


def fault_args(corpus: str, root: Path, *extra: str, fault: str = "") -> list[str]:
    args = smoke_args(corpus, f"--run.root={root}", *COMMON, *extra)
    return [*args, "--trainer.callbacks+=tests.fault_probe.FaultProbe"] if fault else args


def fit_process(corpus: str, root: Path, *extra: str, fault: str = "", timeout: int = 300, **env: str):
    """A fit in its own process: for the faults that end a process (SIGKILL, a second SIGTERM, a dead rank) and
    for DDP."""
    return resnorm_lm_process(fault_args(corpus, root, *extra, fault=fault), timeout, RESNORM_LM_FAULT=fault, **env)


def fit_here(monkeypatch, corpus: str, root: Path, *extra: str, fault: str = ""):
    """A fit in this process, for the faults a run survives: a SIGTERM (the run's handler saves and returns 143)
    or a NaN loss."""
    monkeypatch.setenv("RESNORM_LM_FAULT", fault)
    return run_cli_captured(fault_args(corpus, root, *extra, fault=fault))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, smoke_corpus):
    """The uninterrupted run the interrupted ones must match, on the session's corpus."""
    root = tmp_path_factory.mktemp("faults") / "straight"
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", *COMMON)) == 0
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    return {"corpus": smoke_corpus, "losses": train_losses(run_dir), "weights": final_weights(run_dir)}


def assert_same_as_baseline(baseline, run_dir: Path) -> None:
    losses = train_losses(run_dir)
    assert [losses[s] for s in range(TOTAL)] == [baseline["losses"][s] for s in range(TOTAL)]
    weights = final_weights(run_dir)
    for name, tensor in baseline["weights"].items():
        assert torch.equal(tensor, weights[name]), name


@pytest.mark.parametrize(
    "fault",
    [
        "step:3",
        "save:4",
        pytest.param("validation:2", marks=pytest.mark.slow),
        pytest.param("partial:4", marks=pytest.mark.slow),
    ],
)
def test_sigkill_at_any_point_then_resume_last_matches_an_uninterrupted_run(baseline, fault, tmp_path, monkeypatch):
    corpus, root = baseline["corpus"], tmp_path / "runs"
    killed = fit_process(corpus, root, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)  # intact: loads
    assert ckpt["global_step"] < TOTAL
    if fault.startswith(("save", "partial")):
        assert list((run_dir / "checkpoints").glob(".tmp-*")), "the killed write should have left its temp file"
    resumed = fit_here(monkeypatch, corpus, root, "--ckpt_path=last")  # the killed one needed its own process
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the stale temp file was cleaned up
    assert_same_as_baseline(baseline, run_dir)


def validated_steps(run_dir: Path) -> list[int]:
    with (run_dir / "metrics.csv").open() as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("val/loss")]


@contextlib.contextmanager
def sigint_handled(handler=signal.default_int_handler):
    """SIGINT's handling in this process for the duration: Python's own (KeyboardInterrupt), as at a terminal,
    whatever this process inherited (a shell starts its background jobs with SIGINT ignored), or ``handler``."""
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    "fault, step, code, said",
    [
        ("sigterm:3", 3, 143, "SIGTERM"),
        ("sigterm_validation:2", 2, 143, "SIGTERM"),
        ("sigint:3", 3, 130, "Ctrl-C (SIGINT)"),
    ],
    ids=["step", "validation", "ctrl-c"],
)
def test_sigterm_or_ctrl_c_saves_records_and_exits_at_once_then_resumes_exactly(
    baseline, tmp_path, monkeypatch, fault, step, code, said
):
    corpus, root = baseline["corpus"], tmp_path / "runs"
    with sigint_handled():
        stopped = fit_here(
            monkeypatch, corpus, root, "--run.checkpoint_every=100", "--run.sample_tokens=20", fault=fault
        )
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the run gave Ctrl-C back
    assert stopped.returncode == code, stopped.stderr[-2000:]
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    assert f"{said}: saved {run_dir / 'checkpoints' / 'last.ckpt'} at step {step}" in stopped.stdout
    assert "preempted=True" in stopped.stdout, stopped.stdout[-2000:]
    assert "SAMPLE" not in stopped.stdout  # no end-of-run sample, and no end-of-run validation:
    assert step not in validated_steps(run_dir) or fault.startswith("sigterm:")
    assert all(s < step for s in validated_steps(run_dir))
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step
    assert json.loads((run_dir / "manifest.json").read_text())["ended"]["preempted"] is True
    summary = json.loads((run_dir / "eval.json").read_text())
    assert summary["preempted"] is True and summary["finished"] is False and summary["val_loss"] is None
    resumed = fit_here(monkeypatch, corpus, root, "--run.checkpoint_every=100", "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run_dir / "eval.json").read_text())["finished"] is True
    assert_same_as_baseline(baseline, run_dir)


def test_a_run_preempted_before_its_first_periodic_checkpoint_resumes_into_last_ckpt(baseline, tmp_path, monkeypatch):
    corpus, root = baseline["corpus"], tmp_path / "runs"
    assert fit_here(monkeypatch, corpus, root, "--run.checkpoint_every=3", fault="sigterm:2").returncode == 143
    resumed = fit_here(monkeypatch, corpus, root, "--run.checkpoint_every=3", "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    checkpoints = root / "prenorm-12l" / "smoke-seed1" / "checkpoints"
    assert not list(checkpoints.glob("last-v*.ckpt"))  # once seen: last-v1.ckpt written, last.ckpt left at step 2
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == TOTAL


def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it(baseline, tmp_path, monkeypatch):
    """A shell's background job (``make train ... &``) starts with SIGINT ignored: the run leaves it so."""
    corpus, root = baseline["corpus"], tmp_path / "runs"
    with sigint_handled(signal.SIG_IGN):
        finished = fit_here(monkeypatch, corpus, root, fault="sigint:3")
    assert finished.returncode == 0 and "preempted=True" not in finished.stdout, finished.stderr[-2000:]
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    assert json.loads((run_dir / "eval.json").read_text())["finished"] is True
    assert_same_as_baseline(baseline, run_dir)


def test_a_second_sigterm_exits_at_once(baseline, tmp_path):
    corpus, root = baseline["corpus"], tmp_path / "runs"
    stopped = fit_process(corpus, root, "--run.checkpoint_every=1", fault="sigterm2:3")
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert "SIGTERM: saved" not in stopped.stdout  # it did not wait for the end of the step
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2


def test_under_ddp_the_ranks_compare_preemption_flags_every_few_steps_only(tmp_path):
    """Sharing the flag is a collective and a host sync: every ``ddp_check_every`` steps, the same on all ranks."""

    class Strategy:
        calls: list[bool] = []

        def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
            self.calls.append(decision)
            return decision

    trainer = SimpleNamespace(world_size=2, strategy=Strategy())
    preempt = Preemption(tmp_path / "last.ckpt", ddp_check_every=5)
    preempt.requested = True
    answers = [preempt._requested_on_any_rank(trainer, step) for step in range(1, 11)]
    assert answers == [False] * 4 + [True] + [False] * 4 + [True] and len(trainer.strategy.calls) == 2
    trainer.world_size = 1  # one process: the local flag, at every step, no collective
    assert preempt._requested_on_any_rank(trainer, 3) and len(trainer.strategy.calls) == 2


@pytest.mark.parametrize("fault", ["die:2:1", "die_late:2:1"])
def test_a_dead_ddp_rank_ends_the_job_with_an_error_not_a_hang(baseline, tmp_path, fault):
    corpus = baseline["corpus"]
    started = time.time()
    proc = fit_process(
        corpus,
        tmp_path / "runs",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--run.dist_timeout_s=60",
        fault=fault,
        timeout=280,
    )
    assert proc.returncode != 0
    # Whichever comes first ends the job: the survivor's next collective fails ("... by peer" at once, or
    # "timed out" after run.dist_timeout_s), or Lightning's child-process observer, which polls every 5 s,
    # sees the dead rank and kills the rest (on a loaded machine, before the survivor reaches a collective).
    stderr = proc.stderr.lower()
    ended_by = [m for m in ("by peer", "timed out", "forcefully terminating all other processes") if m in stderr]
    assert ended_by, proc.stderr[-2000:]
    if fault.startswith("die_late"):
        assert ended_by == ["forcefully terminating all other processes"], proc.stderr[-2000:]
    assert time.time() - started < 200


@pytest.mark.slow
def test_killed_data_preparation_leaves_no_valid_cache_and_is_rebuilt(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_files=30, words_per_file=6000)
    cmd = [
        sys.executable,
        "-m",
        "resnorm_lm.data",
        "prepare",
        "--corpus",
        "text",
        "--files",
        corpus,
        "--vocab-size",
        "2048",
    ]
    clean = subprocess.run([*cmd, "--cache-dir", str(tmp_path / "clean")], cwd=REPO, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr[-2000:]
    reference = json.loads(clean.stdout)
    for delay in (1.0, 2.5, 4.0):
        cache = tmp_path / f"killed{delay}"
        proc = subprocess.Popen(
            [*cmd, "--cache-dir", str(cache)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        time.sleep(delay)
        proc.kill()
        proc.communicate()
        manifests = list(cache.glob("prepared/*/manifest.json"))
        for path in manifests:  # whatever survived must be complete and valid
            manifest = json.loads(path.read_text())
            for split, stats in manifest["splits"].items():
                size = (path.parent / stats["file"]).stat().st_size
                assert size == stats["tokens"] * (2 if manifest["dtype"] == "uint16" else 4), split
        again = subprocess.run([*cmd, "--cache-dir", str(cache)], cwd=REPO, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr[-2000:]
        rebuilt = json.loads(again.stdout)
        assert rebuilt["tokenizer_sha256"] == reference["tokenizer_sha256"]
        assert rebuilt["splits"] == reference["splits"]


# ---------------------------------------------------------------- divergence


def verdict(guard: DivergenceGuard, loss: float, step: int) -> str:
    """The host's verdict on a step of one micro-batch whose loss is ``loss``."""
    window = LossWindow()
    window.add(torch.tensor(loss))
    guard.judge(window.take(), step)
    return guard.read()


def test_guard_flags_nan_inf_and_spikes():
    guard = DivergenceGuard(DivergenceConfig(factor=3.0))
    assert verdict(guard, 5.0, 0) == "ok" and verdict(guard, 4.0, 1) == "ok"
    assert verdict(guard, 11.9, 2) == "ok"  # below 3 x 4.0
    assert verdict(guard, 12.5, 3) == "stop" and "> 3 x running minimum 4" in guard.diverged["reason"]
    assert verdict(DivergenceGuard(DivergenceConfig()), float("nan"), 7) == "stop"
    skipping = DivergenceGuard(DivergenceConfig(on_bad_step="skip", max_skips=2))
    assert verdict(skipping, float("inf"), 0) == "skip" and verdict(skipping, 1.0, 1) == "ok"
    assert verdict(skipping, float("nan"), 2) == "skip" and verdict(skipping, float("nan"), 3) == "stop"
    assert skipping.skipped == 3 and "2 bad steps in a row" in skipping.diverged["reason"]
    with pytest.raises(ValueError, match="on_bad_step must be 'stop' or 'skip'"):
        DivergenceConfig(on_bad_step="ignore")


@pytest.mark.parametrize("verdict", ["auto", "device"])  # auto: host verdicts on the CPU
def test_a_diverging_run_stops_cleanly_and_says_so(baseline, tmp_path, capsys, verdict):
    corpus, root = baseline["corpus"], tmp_path / "runs"
    code = run_cli(
        smoke_args(
            corpus,
            f"--run.root={root}",
            "--model.optim.lr=30",
            "--model.optim.warmup_fraction=0",
            "--trainer.max_steps=30",
            "--model.divergence.factor=1.5",
            "--run.checkpoint_every=1",
            f"--model.divergence.verdict={verdict}",
        )
    )
    out = capsys.readouterr().out
    assert code == 3, out[-2000:]
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    summary = json.loads((run_dir / "eval.json").read_text())
    assert summary["diverged"] is True and summary["diverged_at_step"] is not None and summary["diverged_reason"]
    assert "DIVERGED at step" in out and "diverged=True" in out
    assert json.loads((run_dir / "manifest.json").read_text())["ended"]["diverged"] is True
    weights = final_weights(run_dir)
    assert all(torch.isfinite(t).all() for t in weights.values())  # the last good state was kept
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == summary["diverged_at_step"]  # saved after the last good step, not after the bad one
    assert last["divergence_guard"]["diverged"] is None


def test_skip_mode_counts_skipped_steps(baseline, tmp_path, capsys):
    corpus, root = baseline["corpus"], tmp_path / "runs"
    code = run_cli(
        smoke_args(
            corpus,
            f"--run.root={root}",
            "--model.optim.lr=30",
            "--model.optim.warmup_fraction=0",
            "--trainer.max_steps=30",
            "--model.divergence.factor=1.5",
            "--model.divergence.on_bad_step=skip",
            "--model.divergence.max_skips=3",
        )
    )
    summary = json.loads((root / "prenorm-12l" / "smoke-seed1" / "eval.json").read_text())
    assert summary["skipped_steps"] >= 1
    assert code == (3 if summary["diverged"] else 0)


@pytest.mark.parametrize("verdict", ["host", "device"])
def test_resume_after_a_skipped_bad_step_is_exact(baseline, tmp_path, monkeypatch, verdict):
    corpus = baseline["corpus"]
    skip = ["--model.divergence.on_bad_step=skip", f"--model.divergence.verdict={verdict}"]
    straight = fit_here(monkeypatch, corpus, tmp_path / "straight", *skip, fault="nan:2")
    assert straight.returncode == 0, straight.stderr[-2000:]
    root = tmp_path / "interrupted"
    assert fit_here(monkeypatch, corpus, root, *skip, "--run.stop_after_steps=4", fault="nan:2").returncode == 0
    resumed = fit_here(monkeypatch, corpus, root, *skip, "--ckpt_path=last", fault="nan:2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected, run_dir = tmp_path / "straight" / "prenorm-12l" / "smoke-seed1", root / "prenorm-12l" / "smoke-seed1"
    assert json.loads((run_dir / "eval.json").read_text())["skipped_steps"] == 1
    finite = [{s: v for s, v in train_losses(d).items() if math.isfinite(v)} for d in (run_dir, expected)]
    assert finite[0] == finite[1] and len(finite[0]) >= 5  # the same batches after the resume
    resumed_weights = final_weights(run_dir)
    for name, tensor in final_weights(expected).items():
        assert torch.equal(tensor, resumed_weights[name]), name


@pytest.mark.parametrize("on_bad_step", ["skip", "stop"])
@pytest.mark.parametrize("verdict", ["host", "device"])
def test_under_ddp_a_bad_loss_on_one_rank_is_one_verdict_for_every_rank(baseline, tmp_path, verdict, on_bad_step):
    """Only rank 1's loss is NaN at step 2: both ranks skip that step and stay identical, or both stop with exit 3."""
    corpus, probe = baseline["corpus"], tmp_path / "probe"
    probe.mkdir()
    proc = fit_process(
        corpus,
        tmp_path / "runs",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        f"--model.divergence.verdict={verdict}",
        f"--model.divergence.on_bad_step={on_bad_step}",
        "--run.dist_timeout_s=60",
        "--trainer.callbacks+=tests.ddp_probe.RecordRankBatches",
        fault="nan:2:1",
        timeout=240,
        RESNORM_LM_PROBE_DIR=str(probe),
    )
    assert proc.returncode == (0 if on_bad_step == "skip" else 3), proc.stderr[-3000:]
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the replicas did not drift apart
    run_dir = tmp_path / "runs" / "prenorm-12l" / "smoke-seed1"
    summary = json.loads((run_dir / "eval.json").read_text())
    if on_bad_step == "skip":
        assert summary["skipped_steps"] == 1 and summary["step"] == TOTAL and summary["diverged"] is False
    else:
        assert "DIVERGED at step 2: loss is nan" in proc.stdout and "diverged=True" in proc.stdout
        assert summary["diverged_at_step"] == 2 and summary["diverged_reason"] == "loss is nan"
        assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2


def test_compare_shows_diverged_runs_as_diverged():
    spec = RunSpec("postnorm-12l-nowarmup", Setting(2e-3, 0), 1)
    every_seed_diverged = select(spec.recipe, [RunOutcome(spec, None, diverged=True)])
    row = recipe_row(every_seed_diverged, {}, unigram=6.4)
    assert row["status"] == "diverged at every setting (1 runs)" and "val_loss_mean" not in row
    grid = grid_rows({spec.recipe: every_seed_diverged}, unigram=6.4)
    assert grid[0]["status"] == "diverged 1/1" and grid[0]["val_loss_mean"] is None
    text = markdown_report([row], grid, "cpu", "make compare", 6.4, "a CPU")
    assert "| postnorm-12l-nowarmup | - | - | 0 | - | - | - | - | - | - | diverged at every setting (1 runs) |" in text


def test_a_setting_where_one_seed_diverged_shows_the_others_and_is_never_chosen(tmp_path):
    from resnorm_lm.analysis.plots import plot_lr_sensitivity

    def run(lr: float, seed: int, loss: float | None) -> RunOutcome:
        return RunOutcome(RunSpec("rezero-12l", Setting(lr, 200), seed), loss, diverged=loss is None)

    # seen on the H100 sweep: rezero at 1.6e-2 gave 5.071, 5.032 and one divergence
    outcomes = [run(4e-3, s, v) for s, v in ((1, 5.39), (2, 5.40), (3, 5.42))]
    outcomes += [run(1.6e-2, 1, 5.071), run(1.6e-2, 2, 5.032), run(1.6e-2, 3, None)]
    sel = select("rezero-12l", outcomes)
    assert sel.chosen.setting.lr == 4e-3  # lower finite losses at 1.6e-2 do not win: it must train every time
    grid = {g["lr"]: g for g in grid_rows({"rezero-12l": sel}, unigram=6.4)}
    assert grid[1.6e-2]["val_loss_mean"] == pytest.approx((5.071 + 5.032) / 2)  # not inf
    assert grid[1.6e-2]["status"] == "diverged 1/3" and grid[1.6e-2]["n_diverged"] == 1
    text = markdown_report([], list(grid.values()), "cpu", "make compare", 6.4, "x")
    assert "| rezero-12l | 0.016 | 200 | 3 | 5.051 ± 0.028 | - | diverged 1/3 |  |" in text and "inf" not in text
    assert plot_lr_sensitivity(list(grid.values()), 6.4, tmp_path).stat().st_size > 10_000


# ---------------------------------------------------------------- atomic checkpoint files


def test_atomic_checkpoint_io_never_leaves_a_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"global_step": 2}, path)
    assert torch.load(path, weights_only=True) == {"global_step": 1}
    assert list(tmp_path.iterdir()) == [path]


def test_a_checkpoint_write_syncs_the_file_renames_it_then_syncs_the_folder(tmp_path, monkeypatch):
    """Without the folder's fsync a rename can be lost to a power cut, leaving the previous checkpoint."""
    import stat

    import resnorm_lm.data.cache as atomic_files

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append(f"rename to {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(atomic_files.os, "fsync", fsync)
    monkeypatch.setattr(atomic_files.os, "replace", replace)
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, tmp_path / "last.ckpt")
    assert events == ["fsync file", "rename to last.ckpt", "fsync folder"]


# ---------------------------------------------------------------- bad input


def test_unwritable_run_directory_fails_before_training(baseline, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code = run_cli(smoke_args(baseline["corpus"], f"--run.root={blocker / 'runs'}"))
    assert code == 2 and "cannot write the run directory" in capsys.readouterr().err


def test_write_probe_leaves_another_ranks_probe_alone(tmp_path):
    """Every DDP rank checks the run directory at once: one rank's probe is never another's to remove."""
    from resnorm_lm.train.lightning_cli import check_writable

    in_flight = tmp_path / ".write-probe"  # the name each rank used to share: a rank's probe mid-check
    in_flight.write_bytes(b"ok")
    check_writable(tmp_path)
    assert in_flight.read_bytes() == b"ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".write-probe"]  # its own probe removed


def test_a_run_being_trained_by_another_process_is_refused_and_left_alone(baseline, tmp_path, capsys):
    """`make train` twice on one run (or compare started again while a killed compare's runs still train):
    the second is refused with who holds the run, before it writes anything, and the first's files stay."""
    from resnorm_lm.train.runs import RunLock

    root = tmp_path / "runs"
    run_dir = root / "prenorm-12l" / "smoke-seed1"
    assert run_cli(smoke_args(baseline["corpus"], f"--run.root={root}", *COMMON, "--trainer.max_steps=3")) == 0
    files = [run_dir / "eval.json", run_dir / "metrics.csv", run_dir / "checkpoints" / "last.ckpt"]
    before = [f.read_bytes() for f in files]
    hold = f"from resnorm_lm.train.runs import RunLock; lock = RunLock({str(run_dir)!r}); lock.acquire(); "
    holder = subprocess.Popen(
        [sys.executable, "-c", hold + "print('held', flush=True); import time; time.sleep(120)"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        code = run_cli(smoke_args(baseline["corpus"], f"--run.root={root}", *COMMON, "--ckpt_path=last"))
        err = capsys.readouterr().err
        assert code == 2 and "is being trained by another process" in err and f"pid {holder.pid} on " in err, err
        assert [f.read_bytes() for f in files] == before
    finally:
        holder.kill()  # SIGKILL: the kernel releases its lock, nothing stale is left
        holder.wait()
    lock = RunLock(run_dir)
    lock.acquire()  # free again at once
    assert lock.held and f"pid {os.getpid()} on " in (run_dir / ".lock").read_text()
    lock.release()


def test_the_run_lock_is_released_when_the_run_ends(baseline, tmp_path):
    """Trained then resumed in one process: the first fit's lock is gone by the second (main() drops it when
    the fit ends). Under DDP only rank 0 takes it: the DDP tests train with two ranks in one run directory."""
    from resnorm_lm.train.runs import RunLock

    root = tmp_path / "runs"
    args = smoke_args(baseline["corpus"], f"--run.root={root}", *COMMON)
    assert run_cli([*args, "--trainer.max_steps=3"]) == 0
    assert run_cli([*args, "--ckpt_path=last"]) == 0
    lock = RunLock(root / "prenorm-12l" / "smoke-seed1")
    lock.acquire()
    lock.release()


def test_a_filesystem_without_locks_warns_and_trains(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    from resnorm_lm.train.runs import RunLock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    lock = RunLock(tmp_path / "run")
    lock.acquire()
    assert not lock.held and "this filesystem has no file locks" in capsys.readouterr().err


def test_full_disk_fails_before_training(baseline, tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10**6, 10**6))
    code = run_cli(smoke_args(baseline["corpus"], f"--run.root={tmp_path / 'runs'}"))
    assert code == 2 and "MiB free on the disk" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "prenorm-12l" / "smoke-seed1" / "checkpoints").exists()


def test_malformed_yaml_config(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  arch: [unclosed\n")
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(bad)])
    assert exit_.value.code != 0
    err = capsys.readouterr().err
    assert "did not find expected" in err and "line 2" in err  # the YAML error and where it is


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--data.block_size=100000", "--model.arch.n_layer=1"], "fewer than one window"),
        (["--data.vocab_size=70000", "--data.dtype=uint16"], "uint16"),
    ],
)
def test_data_that_cannot_fit_the_config_is_refused(baseline, tmp_path, capsys, extra, message):
    code = run_cli(smoke_args(baseline["corpus"], f"--run.root={tmp_path / 'runs'}", *extra))
    assert code == 2
    assert message in capsys.readouterr().err


def test_empty_corpus_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for i in range(4):
        (empty / f"{i}.txt").write_text("\n")
    code = run_cli(smoke_args(str(empty / "*.txt"), f"--run.root={tmp_path / 'runs'}"))
    err = capsys.readouterr().err
    assert code == 2 and "give more text or files" in err


def test_resume_from_a_corrupt_or_foreign_checkpoint_is_refused(baseline, tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"\x00garbage")
    code = run_cli(smoke_args(baseline["corpus"], f"--run.root={tmp_path / 'runs'}", f"--ckpt_path={bad}"))
    assert code == 2 and "corrupt, truncated or not a checkpoint" in capsys.readouterr().err


def test_resume_on_different_data_is_refused(baseline, tmp_path, capsys):
    root = tmp_path / "runs"
    assert run_cli(smoke_args(baseline["corpus"], f"--run.root={root}", "--trainer.max_steps=2")) == 0
    other = write_corpus(tmp_path / "other", seed=7)
    code = run_cli(smoke_args(other, f"--run.root={root}", "--ckpt_path=last"))
    assert code == 2 and "different data or tokenizer" in capsys.readouterr().err


def test_the_lr_figure_has_a_panel_per_recipe_with_the_seeds_spread(tmp_path, monkeypatch):
    """One small panel per recipe on a shared loss axis, a line per warmup with the seeds' std as error bars, the
    warmups' legend once for the figure (not over any panel's data)."""
    import matplotlib.pyplot as plt

    from resnorm_lm.analysis import plots

    closed = []
    monkeypatch.setattr(plots.plt, "close", lambda fig: closed.append(fig))
    grid = [
        {"recipe": r, "lr": lr, "warmup": w, "val_loss_mean": 5.0 + lr, "val_loss_std": 0.01 * (1 + i),
         "n_diverged": 0, "status": "ok", "chosen": lr == 2e-3 and w == 0.25}
        for i, r in enumerate(("prenorm-12l", "postnorm-12l", "lns-12l"))
        for lr in (1e-3, 2e-3, 4e-3)
        for w in (0.25, 0.5)
    ]  # fmt: skip
    plots.plot_lr_sensitivity(grid, 6.4, tmp_path)
    fig = closed[0]
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["prenorm-12l", "postnorm-12l", "lns-12l"]
    for i, ax in enumerate(axes):
        bars = [c for c in ax.containers if c.has_yerr]
        assert len(bars) == 2  # a line per warmup
        segments = bars[0].lines[2][0].get_segments()  # the error bars: mean -/+ std
        assert [round(s[1][1] - s[0][1], 6) for s in segments] == [round(0.02 * (1 + i), 6)] * 3
        assert ax.get_legend() is None
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["warmup 0.25", "warmup 0.5"]
    plt.close(fig)
