"""Test set-up: CPU only, deterministic, the Triton interpreter on before any kernel import; the session's data cache,
its training corpus and its smoke runs of each recipe, shared by the tests that only read them."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the import of any Triton kernel module
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# MKL's sgemm may round differently with the memory alignment of its inputs, which differs between processes:
# two runs of one seed then part in the 6th digit of a loss, and the tests that compare processes bit for bit
# (exact resume) fail at random. Conditional Numerical Reproducibility, strict: the same bits on one CPU.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# One thread per process, here and in the processes the tests start: the tests' models are tiny, and with two
# threads each op waits on a thread barrier; on a machine whose cores are busy with other work that wait is
# 100 times the op (a 3-block, 32-wide forward: 0.28 s on 2 threads beside a training run, 3 ms on 1). A test
# that needs more threads sets them itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.smoke import run_cli, run_cli_captured, smoke_args, write_corpus  # noqa: E402

TRAINS = {"smoke_corpus", "recipe_run"}  # what every test that trains through the command takes, directly or not


def pytest_collection_modifyitems(items):
    """A test that trains through the command takes the session's corpus: marked ``training`` (left out of
    ``make test-quick``) here, once, rather than by hand on each."""
    for item in items:
        if TRAINS & set(item.fixturenames):
            item.add_marker(pytest.mark.training)


@pytest.fixture(autouse=True, scope="session")
def data_cache(tmp_path_factory) -> Path:
    """No test writes to the user's cache (``precision: auto`` keeps its probe there): one for the session, which
    subprocesses inherit. Prepared data is keyed by its corpus files (paths, sizes, times) and settings, so the
    runs on ``smoke_corpus`` prepare each setting's tokenizer and token bins once and share them, read-only.

    Tests that need a cache of their own set RESNORM_LM_CACHE, or pass ``data.cache_dir``, themselves.
    """
    cache = tmp_path_factory.mktemp("resnorm-lm-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RESNORM_LM_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def smoke_corpus(tmp_path_factory) -> str:
    """The training tests' corpus (tests/smoke.py's ``write_corpus``), written once: a glob for ``data.files``.
    Read-only: a test that changes text copies it first."""
    return write_corpus(tmp_path_factory.mktemp("smoke-corpus"))


@pytest.fixture(scope="session")
def recipe_run(tmp_path_factory, smoke_corpus):
    """``recipe_run(recipe)``: the run directory of ``recipe`` trained 2 steps on the smoke profile, trained on
    the first request and shared by the session's tests, which only read it."""
    root, runs = tmp_path_factory.mktemp("recipe-runs"), {}

    def run(recipe: str) -> Path:
        if recipe not in runs:
            done = run_cli_captured(
                smoke_args(
                    smoke_corpus,
                    f"--run.root={root}",
                    "--trainer.max_steps=2",
                    "--trainer.val_check_interval=2",
                    recipe=recipe,
                )
            )
            assert done.returncode == 0, f"{recipe}: exit {done.returncode}\n{done.stderr[-2000:]}"
            runs[recipe] = root / recipe / "smoke-seed1"
        return runs[recipe]

    return run


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def fits_in_this_process(monkeypatch):
    """compare's (and a suite's) fits run in this process, not each in its own (test_eval's compare test starts
    those): the same commands, without a torch and Lightning import for each."""
    from resnorm_lm.analysis.launchers import RunningFits

    def run(self, cmd, cwd, env, stdout, stderr):
        assert cmd[1:3] == ["-m", "resnorm_lm"] and stdout is None, cmd  # one job at a time, its output here
        with contextlib.chdir(cwd):
            return run_cli(cmd[3:])

    monkeypatch.setattr(RunningFits, "run", run)


@pytest.fixture
def fresh_dynamo():
    """Dynamo's compiled code of the GPT's methods released afterwards: every compiled test in the process counts
    against one recompile limit per code object."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
