"""A checkpoint is data, never code: a payload pickle is refused at every entry point before it runs,
and every checkpoint the project writes still loads for resume, eval and generate."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from resnorm_lm.train.checkpoint_io import (
    AtomicCheckpointIO,
    CheckpointFileError,
    UnsafeCheckpointError,
    read_checkpoint_file,
)
from tests.smoke import run_cli, smoke_args

REPO = Path(__file__).resolve().parent.parent


class Payload:
    """Unpickling this calls os.system: the marker file exists afterwards iff the payload ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_payload_checkpoint(path: Path, marker: Path, legacy: bool = False) -> Path:
    """A file shaped like a resnorm-lm checkpoint, with a payload among its hyperparameters."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = {
        "global_step": 2,
        "state_dict": {"w": torch.zeros(2)},
        "precision": "32-true",
        "hyper_parameters": {"arch": {"n_layer": 2}, "note": Payload(marker)},
    }
    torch.save(ckpt, path, _use_new_zipfile_serialization=not legacy)
    return path


@pytest.fixture
def payload(tmp_path):
    marker = tmp_path / "PAYLOAD_RAN"

    def make(path: Path, legacy: bool = False) -> Path:
        return write_payload_checkpoint(path, marker, legacy)

    make.marker = marker
    return make


def assert_refused_without_running(err: str, marker: Path) -> None:
    assert not marker.exists(), "the checkpoint's payload ran"
    assert "contains objects a checkpoint never holds" in err and "posix.system" in err, err
    assert "weights_only" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
def test_the_reader_refuses_a_payload_and_names_it(payload, tmp_path, legacy):
    path = payload(tmp_path / "evil.ckpt", legacy=legacy)
    for mmap in (False, True):
        with pytest.raises(UnsafeCheckpointError) as err:
            read_checkpoint_file(path, mmap=mmap)
        assert_refused_without_running(str(err.value), payload.marker)


def test_a_raw_pickle_payload_is_refused_as_no_checkpoint(tmp_path):
    import pickle

    marker = tmp_path / "PAYLOAD_RAN"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"global_step": 1, "x": Payload(marker)}))
    with pytest.raises(CheckpointFileError, match="not a checkpoint") as err:
        read_checkpoint_file(path)
    assert not marker.exists() and "weights_only" not in str(err.value)


def test_lightnings_loader_reads_as_data_even_when_asked_not_to(payload, tmp_path):
    """Lightning resumes through the trainer's CheckpointIO plugin, which the CLI sets to this one."""
    path = payload(tmp_path / "evil.ckpt")
    with pytest.raises(UnsafeCheckpointError):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert not payload.marker.exists()


def test_fit_refuses_a_payload_given_as_ckpt_path(payload, tmp_path, smoke_corpus, capsys):
    evil = payload(tmp_path / "shared" / "evil.ckpt")
    code = run_cli(smoke_args(smoke_corpus, f"--run.root={tmp_path / 'runs'}", f"--ckpt_path={evil}"))
    assert code == 2
    assert_refused_without_running(capsys.readouterr().err, payload.marker)


def test_resume_last_refuses_a_payload_planted_as_last_ckpt(payload, tmp_path, smoke_corpus, capsys):
    root = tmp_path / "runs"
    payload(root / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt")
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--ckpt_path=last")) == 2
    assert_refused_without_running(capsys.readouterr().err, payload.marker)


@pytest.mark.parametrize("command", [["eval"], ["generate", "--tokens", "3"]])
def test_eval_and_generate_refuse_a_payload(payload, tmp_path, capsys, command):
    from resnorm_lm.cli import main

    evil = payload(tmp_path / "evil.ckpt")
    assert main([command[0], str(evil), *command[1:]]) == 2
    assert_refused_without_running(capsys.readouterr().err, payload.marker)


def test_compare_refuses_a_payload_in_a_run_it_must_evaluate(payload, tmp_path, capsys):
    from resnorm_lm.cli import main

    run_dir = tmp_path / "runs" / "prenorm-12l" / "smoke-seed1"
    payload(run_dir / "checkpoints" / "last.ckpt")
    (run_dir / "eval.json").write_text(json.dumps({"finished": True, "step": 2}))  # finished, never evaluated
    code = main(
        [
            "compare",
            "--recipes",
            "prenorm-12l",
            "--profile",
            "smoke",
            "--no-train",
            "--root",
            str(tmp_path / "runs"),
            "--results",
            str(tmp_path / "results"),
        ]
    )
    assert code == 2
    assert_refused_without_running(capsys.readouterr().err, payload.marker)


def test_no_code_path_loads_a_checkpoint_other_than_through_the_safe_reader():
    """The notebooks and benchmarks load no checkpoint themselves; nothing may bypass read_checkpoint_file."""
    sources = [
        *REPO.glob("resnorm_lm/**/*.py"),
        *REPO.glob("benchmarks/*.py"),
        *REPO.glob("notebooks/*.ipynb"),
        *REPO.glob("notebooks/*.py"),
    ]
    loads = re.compile(r"torch\.load\(|pickle\.loads?\(|load_from_checkpoint")
    offenders = []
    for path in sources:
        text = path.read_text()
        if path.name != "checkpoint_io.py" and loads.search(text):
            offenders.append(str(path.relative_to(REPO)))
        # weights_only=False is an unrestricted load, except in save_checkpoint, where it means a full save
        if any("weights_only=False" in line and "save_checkpoint(" not in line for line in text.splitlines()):
            offenders.append(f"{path.relative_to(REPO)} (weights_only=False)")
    assert len(sources) > 20 and not offenders, offenders


# ---------------------------------------------------------------------- the project's own checkpoints

VARIANTS = {
    # the smoke profile as the tests use it: 32-true, host verdicts, torch norms
    "smoke": [],
    # what a gpu-profile run writes, as far as a CPU can: bf16-mixed, fused AdamW with device verdicts,
    # gradient accumulation, the fused Triton norms (interpreted here)
    "gpu-like-triton-device-verdicts": [
        "--trainer.precision=bf16-mixed",
        "--model.divergence.verdict=device",
        "--trainer.accumulate_grad_batches=2",
        "--model.arch.norm_backend=triton",
    ],
    # the cpu profile's settings (width 128, 4 heads, its schedule and checkpointing), shrunk in depth and data
    "cpu": [
        "--model.arch.n_layer=2",
        "--data.vocab_size=512",
        "--data.block_size=32",
        "--data.batch_size=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2",
        "--run.sample_tokens=0",
    ],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_checkpoint_the_project_writes_loads_for_resume_eval_and_generate(
    tmp_path, smoke_corpus, capsys, variant
):
    from resnorm_lm.cli import main

    profile = "cpu" if variant == "cpu" else "smoke"
    root = tmp_path / "runs"
    args = smoke_args(smoke_corpus, f"--run.root={root}", "--trainer.max_steps=4", *VARIANTS[variant])
    args[args.index("--profile") + 1] = profile
    assert run_cli([*args, "--run.stop_after_steps=2"]) == 0
    run_dir = root / "prenorm-12l" / f"{profile}-seed1"
    assert read_checkpoint_file(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 2
    assert run_cli([*args, "--ckpt_path=last"]) == 0  # resume: Lightning reads it through the safe reader
    assert read_checkpoint_file(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 4
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--split", "validation"]) == 0
    assert main(["generate", str(run_dir), "--tokens", "5", "--prompt", "The king"]) == 0
    assert capsys.readouterr().out.count("The king") == 1
