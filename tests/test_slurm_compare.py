"""compare through a real SLURM (tests/slurm_cluster.py): a smoke sweep of 2 recipes x 2 LRs x 1 seed whose
tables equal the local launcher's, and a compare stopped while its jobs are queued and run again, which submits
no run twice and completes the sweep. tests/test_slurm_launcher.py checks the launcher's rules without SLURM.

Slow: one to three minutes each on 2 busy cores; CI runs them against the repository's own cluster (.ci/run).
"""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resnorm_lm.train.runs import RunDir
from tests.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 (a fixture)
from tests.smoke import default_sigint, write_corpus

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RUNS = {
    f"{recipe}/smoke-lr{lr}-wf0.33-seed1" for recipe in ("prenorm-12l", "postnorm-12l") for lr in ("0.001", "0.003")
}
# measured wall-clock time: it differs between any two sweeps, whichever launcher ran them
TIMED_COLUMNS = ("train_s", "tokens_per_s")


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> SlurmCluster:  # noqa: F811 (the imported fixture)
    """The session's cluster (tests/slurm_cluster.py), by a name that does not shadow its import."""
    return slurm_cluster


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def site_config(tmp_path: Path, max_jobs: int) -> Path:
    """The site's settings as a file, as a user writes them: the local cluster's partition, one CPU per run."""
    path = tmp_path / "site.yaml"
    path.write_text(f'partition: local\ntime: "00:20:00"\ncpus_per_run: 1\nmax_jobs: {max_jobs}\npoll_seconds: 1\n')
    return path


def compare_argv(tmp_path: Path, corpus: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "resnorm_lm",
        "compare",
        "--recipes",
        "prenorm-12l",
        "postnorm-12l",
        "--profile",
        "smoke",
        "--lrs",
        "1e-3",
        "3e-3",
        "--warmups",
        "0.33",
        "--seeds",
        "1",
        "--root",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
        "--train-args",
        f"--data.corpus=text --data.files=[{corpus}] --data.cache_dir={tmp_path / 'cache'} "
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


def environment(cluster: SlurmCluster) -> dict[str, str]:
    """One thread in compare and in every job, whichever launcher: the same arithmetic, bit for bit."""
    return cluster.environment(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def run_compare(cluster: SlurmCluster, argv: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=REPO, env=environment(cluster), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def sweep_jobs(cluster: SlurmCluster, root: Path) -> dict[str, list[str]]:
    """The jobs SLURM knows (queued, running, or ended within MinJobAge) of each run under ``root``, by
    '<recipe>/<run directory>': the comment compare gives each job."""
    out = cluster.command("squeue", "--noheader", "--states=all", "--format=%i %k").stdout
    jobs: dict[str, list[str]] = {}
    for line in out.splitlines():
        job_id, _, comment = line.strip().partition(" ")
        if comment.startswith(f"{root}/"):
            jobs.setdefault(comment.removeprefix(f"{root}/"), []).append(job_id)
    return jobs


def logs(root: Path) -> dict[str, list[str]]:
    return {run: sorted(p.name for p in (root / run).glob("slurm-*.out")) for run in RUNS}


def read_csv(path: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in TIMED_COLUMNS} for row in csv.DictReader(path.open())]


def test_a_smoke_sweep_through_slurm_writes_the_tables_the_local_launcher_writes(cluster, corpus, tmp_path):
    """The same sweep twice, in the same --root and --results (so the command line the tables record is the
    same): by the local launcher, moved aside, then through SLURM. Only the line with the date and the hours of
    training in compare.md, and the timed columns of compare.csv, may differ."""
    run_compare(cluster, compare_argv(tmp_path, corpus))
    (tmp_path / "runs").rename(tmp_path / "runs-local")
    (tmp_path / "results").rename(tmp_path / "results-local")
    argv = compare_argv(tmp_path, corpus, "--launcher", "slurm", "--slurm-config", str(site_config(tmp_path, 4)))
    first = run_compare(cluster, argv)
    assert "compare: SLURM: 4 runs to train: 0 already queued or running, 4 to submit" in first.stdout
    assert "compare: SLURM jobs: 0 to submit, 0 queued, 0 running, 4 done, 0 failed" in first.stdout
    root = tmp_path / "runs"
    jobs = sweep_jobs(cluster, root)
    assert jobs.keys() == RUNS and all(len(ids) == 1 for ids in jobs.values()), jobs
    assert logs(root) == {run: [f"slurm-{ids[0]}.out"] for run, ids in jobs.items()}
    assert all(RunDir(root / run).state() == "finished" for run in RUNS)
    local, slurm = tmp_path / "results-local" / "smoke", tmp_path / "results" / "smoke"
    assert read_csv(slurm / "grid.csv") == read_csv(local / "grid.csv")
    assert read_csv(slurm / "compare.csv") == read_csv(local / "compare.csv")
    assert set(TIMED_COLUMNS) <= set(csv.DictReader((slurm / "compare.csv").open()).fieldnames)
    untimed = [
        [line for line in (d / "compare.md").read_text().splitlines() if not line.startswith("Date: ")]
        for d in (local, slurm)
    ]
    assert untimed[0] == untimed[1] and len(untimed[0]) > 20
    again = run_compare(cluster, argv)  # everything finished: nothing submitted, the same tables
    assert "nothing to train" in again.stdout and "SLURM job" not in again.stdout
    assert sweep_jobs(cluster, root) == jobs
    assert read_csv(slurm / "compare.csv") == read_csv(local / "compare.csv")


def test_compare_stopped_while_its_jobs_queue_and_run_again_submits_no_run_twice_and_completes(
    cluster, corpus, tmp_path
):
    """A job that fills the node keeps the sweep's first two jobs (--slurm-max-jobs 2) queued: compare is stopped
    (Ctrl-C) with them in the queue, and started again it waits for those two and submits the other two."""
    root = tmp_path / "runs"
    argv = compare_argv(tmp_path, corpus, "--launcher", "slurm", "--slurm-config", str(site_config(tmp_path, 2)))
    cpus = cluster.command("sinfo", "--noheader", "--format=%c").stdout.split()[0]
    blocker = cluster.command(
        "sbatch", "--parsable", f"--cpus-per-task={cpus}", "--output=/dev/null", "--wrap=sleep 600"
    ).stdout.strip()
    try:
        cluster.wait(blocker, lambda job: job["JobState"] == "RUNNING", timeout=60)
        # Ctrl-C as at a terminal: a shell starts a background command (CI's, say `bash .ci/run &`) with SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler, so compare would never see the signal
        first = subprocess.Popen(
            argv,
            cwd=REPO,
            env=environment(cluster),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=default_sigint,
        )
        deadline = time.monotonic() + 300
        while sum(map(len, sweep_jobs(cluster, root).values())) < 2:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-3000:]
            time.sleep(0.5)
        first.send_signal(signal.SIGINT)
        out = first.communicate(timeout=60)[0]
        assert first.returncode == 130 and "compare: stopped waiting; the SLURM jobs go on" in out, out[-3000:]
        queued = sweep_jobs(cluster, root)
        assert len(queued) == 2 and all(len(ids) == 1 for ids in queued.values()), queued
        assert all(cluster.job(ids[0])["JobState"] == "PENDING" for ids in queued.values())

        second = subprocess.Popen(
            argv, cwd=REPO, env=environment(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        held = ", ".join(sorted((ids[0] for ids in queued.values()), key=int))
        said = f"compare: SLURM: 4 runs to train: 2 already queued or running (job {held}), 2 to submit"
        lines = []
        for line in second.stdout:  # until it has looked at the queue; the blocker still holds the node
            lines.append(line)
            if line.startswith("compare: SLURM: "):
                break
        assert said in "".join(lines), "".join(lines)[-3000:]
        cluster.command("scancel", blocker)
        out = "".join(lines) + second.communicate(timeout=600)[0]
        assert second.returncode == 0, out[-4000:]
        assert "compare: SLURM jobs: 0 to submit, 0 queued, 0 running, 4 done, 0 failed" in out
    finally:
        cluster.command("scancel", blocker, check=False)
        stray = [job_id for ids in sweep_jobs(cluster, root).values() for job_id in ids]
        if stray:  # after a failure: no job of this test is left in the queue
            cluster.command("scancel", *stray, check=False)
    jobs = sweep_jobs(cluster, root)
    assert jobs.keys() == RUNS and all(len(ids) == 1 for ids in jobs.values()), jobs  # one job for each run
    assert all(jobs[run] == ids for run, ids in queued.items())  # the first compare's, waited for
    assert logs(root) == {run: [f"slurm-{ids[0]}.out"] for run, ids in jobs.items()}
    assert all(RunDir(root / run).state() == "finished" for run in RUNS)
    assert (tmp_path / "results" / "smoke" / "compare.csv").is_file()
