"""A real single-host SLURM for the tests: the ``slurm_cluster`` fixture and a handle to submit and watch jobs.

The cluster is the repository's own (scripts/slurm_local.sh). A test module takes the fixture by importing it,
and by a name of its own where a test asks for it (ruff takes a parameter named as an import for a shadow)::

    from tests.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 (a fixture)

    @pytest.fixture(scope="module")
    def cluster(slurm_cluster) -> SlurmCluster:  # noqa: F811 (the imported fixture)
        return slurm_cluster

It is one cluster for the whole session. A cluster that already runs (``scripts/slurm_local.sh start`` by
hand, or by CI) is used and left running; else the fixture starts one and stops it at the end of the session.
Where none can start, the tests skip with a line saying how to run them. RESNORM_LM_SLURM_TESTS=require (CI
sets it) turns that skip into a failure, and lets the script install slurm-wlm and munge when missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
HOW_TO_RUN = (
    "as root on Debian or Ubuntu: `scripts/slurm_local.sh start` (installs slurm-wlm and munge when missing), "
    "then `RESNORM_LM_SLURM_TESTS=require .venv/bin/python -m pytest tests/test_slurm_jobs.py`, then "
    "`scripts/slurm_local.sh stop`"
)
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: SLURM's commands pointed at it (``SLURM_CONF``), and its jobs as dictionaries."""

    conf: Path

    def environment(self, **extra: str) -> dict[str, str]:
        """This process's environment, SLURM_CONF and ``extra``: what a job submitted with it sees (--export=ALL)."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def command(self, *argv: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        done = subprocess.run(argv, env=self.environment(**env), capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done

    def submit(self, script: Path, *options: str, **env: str) -> str:
        """``sbatch`` a script from the repository root; its job id."""
        done = self.command("sbatch", "--parsable", f"--chdir={REPO}", *options, str(script), **env)
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, Reason, StdOut, ...)."""
        text = self.command("scontrol", "-o", "show", "job", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: str, until, timeout: float, log: Path | None = None) -> dict[str, str]:
        """Poll the job until ``until(job)`` holds; fail with its state and log after ``timeout`` s, or when it
        ended before that."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            ended = job["JobState"] in DONE
            if ended or time.monotonic() > deadline:
                tail = log.read_text()[-4000:] if log is not None and log.is_file() else ""
                why = "ended" if ended else f"still waiting after {timeout:.0f} s"
                raise AssertionError(f"job {job_id} {why}: {job.get('JobState')} ({job.get('Reason')})\n{tail}")
            time.sleep(0.5)

    def wait_until_done(self, job_id: str, timeout: float, log: Path | None = None) -> dict[str, str]:
        return self.wait(job_id, lambda job: job["JobState"] in DONE, timeout, log)


def script(action: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), action], env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )


def why_not_startable(required: bool) -> str | None:
    """Why this machine cannot start the cluster, or None."""
    if os.name != "posix" or shutil.which("bash") is None:
        return "SLURM runs on Linux"
    installed = all(shutil.which(daemon) for daemon in ("slurmctld", "slurmd", "munged"))
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    if not installed and not (required and shutil.which("apt-get")):
        return "slurm-wlm and munge are not installed"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    required = os.environ.get("RESNORM_LM_SLURM_TESTS") == "require"
    conf = Path(script("env").stdout.strip().split("=", 1)[1])
    if script("status").returncode == 0:  # running already: used, and left running
        yield SlurmCluster(conf)
        return
    reason = why_not_startable(required)
    started = None if reason else script("start")
    if started is not None and started.returncode != 0:
        reason = f"scripts/slurm_local.sh start failed: {started.stdout}{started.stderr}"
    if reason:
        message = f"no SLURM here ({reason}); to run these tests: {HOW_TO_RUN}"
        pytest.fail(message) if required else pytest.skip(message)
    try:
        yield SlurmCluster(conf)
    finally:
        script("stop")
