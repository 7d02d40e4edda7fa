"""Test set-up: CPU only, deterministic, the Triton interpreter on before any kernel import."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the import of any Triton kernel module
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# MKL's sgemm may round differently with the memory alignment of its inputs, which differs between processes:
# two runs of one seed then part in the 6th digit of a loss, and the tests that compare processes bit for bit
# (exact resume) fail at random. Conditional Numerical Reproducibility, strict: the same bits on one CPU.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """No test writes to the user's cache (``precision: auto`` keeps its probe there): a session-wide one instead.

    Tests that need their own cache set RESNORM_LM_CACHE themselves; subprocesses inherit this one.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RESNORM_LM_CACHE", str(tmp_path_factory.mktemp("resnorm-lm-cache")))
        yield


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def fresh_dynamo():
    """Dynamo's compiled code of the GPT's methods released afterwards: every compiled test in the process counts
    against one recompile limit per code object."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
