"""Resume continues one run: both forms (last, a path) are checked alike against the configuration, before
anything is written; the manifest keeps every segment; tokens count what was seen; extending a finished run
keeps its LR schedule."""

from __future__ import annotations

import csv
import json
import warnings

import pytest

from tests.smoke import run_cli, smoke_args, write_corpus

STEPS = ["--trainer.max_steps=4", "--run.checkpoint_every=2", "--trainer.val_check_interval=2"]


@pytest.fixture(scope="module")
def started(tmp_path_factory, smoke_corpus):
    """A prenorm smoke run stopped at step 2 of 4 (its files are copied before a test changes them)."""
    root = tmp_path_factory.mktemp("started") / "runs"
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", *STEPS, "--run.stop_after_steps=2")) == 0
    return {"corpus": smoke_corpus, "root": root, "run_dir": root / "prenorm-12l" / "smoke-seed1"}


def resume_args(started, *extra, recipe="prenorm-12l", root=None):
    root = root or started["root"]
    return smoke_args(started["corpus"], f"--run.root={root}", *STEPS, *extra, recipe=recipe)


def last_ckpt(started) -> str:
    return str(started["run_dir"] / "checkpoints" / "last.ckpt")


def test_a_path_to_another_recipes_checkpoint_is_refused_and_nothing_is_written(started, tmp_path, capsys):
    root = tmp_path / "runs"
    code = run_cli(resume_args(started, f"--ckpt_path={last_ckpt(started)}", recipe="postnorm-12l", root=root))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.arch.placement: checkpoint 'prenorm', now 'postnorm'" in err
    assert "run: recipe: checkpoint 'prenorm-12l', now 'postnorm-12l'" in err
    assert not root.exists()  # no run directory, manifest or config.yaml for the refused run


@pytest.mark.parametrize("form", ["last", "path"])
@pytest.mark.parametrize(
    "override, said",
    [
        ("--model.arch.n_layer=4", "model.arch.n_layer: checkpoint 12, now 4"),
        ("--model.optim.lr=0.05", "model.optim.lr: checkpoint 0.001, now 0.05"),
        ("--data.batch_size=3", "data.batch_size: checkpoint 4, now 3"),
        ("--data.random_offset=false", "data.random_offset: checkpoint True, now False"),
        ("--trainer.accumulate_grad_batches=2", "trainer: accumulate_grad_batches: checkpoint 1, now 2"),
        ("--trainer.devices=2", "trainer: world_size: checkpoint 1, now 2"),
        ("--trainer.max_steps=1", "trainer.max_steps: 1 is before the checkpoint's step 2"),
    ],
)
def test_both_resume_forms_refuse_what_a_resume_cannot_keep(started, capsys, form, override, said):
    ckpt = "last" if form == "last" else last_ckpt(started)
    before = (started["run_dir"] / "config.yaml").read_text()
    assert run_cli(resume_args(started, f"--ckpt_path={ckpt}", override)) == 2
    err = capsys.readouterr().err
    assert said in err and "start a new run" in err and "Traceback" not in err, err
    assert (started["run_dir"] / "config.yaml").read_text() == before  # the run's config is not overwritten


def test_another_data_order_is_another_run(started, capsys):
    """The data order is part of the run: by path its checkpoint is refused, and RESUME=last looks in the run
    directory of that data order (seed1-data7), where there is nothing to resume."""
    assert run_cli(resume_args(started, f"--ckpt_path={last_ckpt(started)}", "--data.seed=7")) == 2
    assert "data.seed: checkpoint 1, now 7" in capsys.readouterr().err
    assert run_cli(resume_args(started, "--ckpt_path=last", "--data.seed=7")) == 2
    assert "there is no run to resume at" in (err := capsys.readouterr().err) and "smoke-seed1-data7" in err


def test_the_data_content_is_checked_before_anything_is_written(started, tmp_path, capsys):
    other = write_corpus(tmp_path / "other", seed=7)
    before = (started["run_dir"] / "config.yaml").read_text()
    args = smoke_args(other, f"--run.root={started['root']}", *STEPS, "--ckpt_path=last")
    assert run_cli(args) == 2
    assert "different data or tokenizer (corpus_fingerprint: checkpoint" in capsys.readouterr().err
    assert (started["run_dir"] / "config.yaml").read_text() == before


def copy_run(started, tmp_path):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(started["root"], root)
    return root, root / "prenorm-12l" / "smoke-seed1"


def test_a_resume_adds_a_manifest_segment_and_counts_the_tokens_it_saw(started, tmp_path):
    root, run_dir = copy_run(started, tmp_path)
    first = json.loads((run_dir / "manifest.json").read_text())
    assert [s["resumed_from_step"] for s in first["segments"]] == [0]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert run_cli(resume_args(started, "--ckpt_path=last", root=root)) == 0
    assert not [w for w in said if "exists and is not empty" in str(w.message)]  # its own folder: no warning
    manifest = json.loads((run_dir / "manifest.json").read_text())
    segments = manifest["segments"]
    assert [s["resumed_from_step"] for s in segments] == [0, 2]
    assert segments[0]["started"] == first["segments"][0]["started"] == manifest["started"]
    assert segments[0]["ended"]["step"] == 2 and segments[1]["ended"]["step"] == 4
    assert all(s["host"] and s["code_revision"] and s["packages"]["torch"] for s in segments)
    summary = json.loads((run_dir / "eval.json").read_text())
    assert summary["tokens"] == 4 * 4 * 32  # 4 steps of 4 windows of 32 tokens, over both segments


def test_a_manifest_written_before_segments_were_kept_becomes_the_first_segment(started, tmp_path):
    """An older run's manifest had its one segment's facts at the top level: a resume keeps them as segment 0."""
    root, run_dir = copy_run(started, tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    flat = {**manifest, "host": "the-old-host", "code_revision": "0123abc"}
    del flat["segments"]
    (run_dir / "manifest.json").write_text(json.dumps(flat))
    assert run_cli(resume_args(started, "--ckpt_path=last", root=root)) == 0
    segments = json.loads((run_dir / "manifest.json").read_text())["segments"]
    assert [s["resumed_from_step"] for s in segments] == [0, 2]
    assert (segments[0]["host"], segments[0]["code_revision"]) == ("the-old-host", "0123abc")
    assert segments[0]["started"] == manifest["started"] and segments[1]["host"] != "the-old-host"


def lrs(run_dir) -> dict[int, float]:
    with (run_dir / "metrics.csv").open() as f:
        return {int(r["step"]): float(r["lr-AdamW/pg1"]) for r in csv.DictReader(f) if r.get("lr-AdamW/pg1")}


def test_extending_a_finished_run_keeps_its_schedule_at_the_floor(started, tmp_path, capsys):
    root, run_dir = copy_run(started, tmp_path)
    assert run_cli(resume_args(started, "--ckpt_path=last", root=root)) == 0  # finishes at step 4
    capsys.readouterr()
    longer = [a for a in resume_args(started, "--ckpt_path=last", root=root) if a != "--trainer.max_steps=4"]
    assert run_cli([*longer, "--trainer.max_steps=7"]) == 0
    assert "the run's LR schedule was made for 4 steps: it stays so" in capsys.readouterr().err
    lr = lrs(run_dir)
    floor = 1e-3 * 0.1  # the smoke profile's lr x the default min_lr_ratio
    assert all(lr[s] == pytest.approx(floor) for s in (4, 5, 6)), lr  # no jump back up
    assert max(lr.values()) == pytest.approx(1e-3) and lr[3] > floor
