"""The ``resnorm-lm`` command's own words: ``--help`` lists every command, and a directory given as
``--ckpt_path`` is named for what it is, with what to give instead."""

from __future__ import annotations

import importlib

import pytest

from resnorm_lm.cli import TOOLS
from resnorm_lm.train.lightning_cli import ResnormCLI
from tests.smoke import run_cli

LIGHTNING_COMMANDS = ("fit", "validate", "test")  # LightningCLI's predict needs a predict_step the model lacks


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_command_with_a_line_that_says_what_it_does(flag, capsys):
    assert run_cli([flag]) == 0
    out = capsys.readouterr().out
    listed = {}
    for line in out.splitlines():
        words = line.split(maxsplit=1)
        if line.startswith("  ") and len(words) == 2:
            listed[words[0]] = words[1]
    assert list(listed) == [*LIGHTNING_COMMANDS, *TOOLS], out
    assert all(len(what.split()) >= 3 for what in listed.values()), out
    assert set(LIGHTNING_COMMANDS) <= set(ResnormCLI.subcommands())  # what it lists, LightningCLI accepts
    for target in TOOLS.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_no_command_at_all_prints_the_list_and_fails(capsys):
    assert run_cli([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: resnorm-lm <command>") and "generate" in err


def test_a_run_directory_as_ckpt_path_is_called_a_directory_and_its_last_checkpoint_named(tmp_path, capsys):
    run_dir = tmp_path / "prenorm-12l" / "smoke-seed1"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")  # only its existence is read before the refusal
    assert run_cli(["fit", f"--ckpt_path={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert f"--ckpt_path {run_dir} is a directory, not a checkpoint" in err, err
    assert f"give a .ckpt file ({run_dir / 'checkpoints' / 'last.ckpt'} is its latest), or `last`" in err, err
    assert "does not exist" not in err and "Traceback" not in err
