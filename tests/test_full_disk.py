"""A disk that fills while a run writes a checkpoint: the run ends with one clear line (the disk, the last good
checkpoint, how to resume), exit 2, no traceback, and nothing written before is lost."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from resnorm_lm.train.checkpoint_io import AtomicCheckpointIO
from tests.smoke import run_cli, smoke_args


@pytest.fixture
def small_disk(tmp_path):
    """A 220 MiB filesystem of its own (tmpfs): room for a run to start (it asks for 200 MiB), little beyond."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=220m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here (needs root): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_disk_that_fills_after_the_first_checkpoint_ends_the_run_clearly(small_disk, smoke_corpus, monkeypatch,
                                                                             capsys):  # fmt: skip
    saves = []
    write = AtomicCheckpointIO.save_checkpoint

    def save_then_fill(self, checkpoint, path, storage_options=None):
        write(self, checkpoint, path, storage_options)
        saves.append(Path(path).name)
        if len(saves) == 1:  # the disk fills up after the first checkpoint, as another program's output would
            with (small_disk / "filler").open("wb") as f:
                block = b"\0" * (1 << 20)
                while True:
                    try:
                        f.write(block)
                        f.flush()
                    except OSError:  # no space left
                        break

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_then_fill)
    args = smoke_args(smoke_corpus, f"--run.root={small_disk}", "--trainer.max_steps=6", "--run.checkpoint_every=1")
    code = run_cli(args)
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("resnorm-lm: error: could not write the checkpoint") and "the disk is full" in line, err
    last = small_disk / "prenorm-12l" / "smoke-seed1" / "checkpoints" / "last.ckpt"
    assert f"nothing is lost: {last} is whole, at step 1" in line and "RESUME=last" in line
    assert "Traceback" not in err
    assert torch.load(last, weights_only=True)["global_step"] == 1  # the good checkpoint is whole
    assert not list(last.parent.glob(".tmp-*"))  # the failed write left nothing half written
