"""compare's SLURM launcher without a cluster: a stand-in for sbatch, squeue and scontrol (``FakeSlurm``, given to
the launcher as its command runner) whose jobs move on each time compare sleeps between polls. What is submitted
and what is not (never two jobs for one run, across a restarted compare), the job's fit command and sbatch
options, the most jobs at once, the progress, a failed job's report, and the site's config file.
tests/test_slurm_compare.py runs a sweep through a real SLURM."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from resnorm_lm.analysis import compare
from resnorm_lm.analysis.slurm_launcher import TRAIN_SBATCH, SlurmError, SlurmOptions, SlurmQueue, SlurmSweepTrainer
from resnorm_lm.analysis.sweep import RunSpec, Setting, expand_grid, grid_settings
from resnorm_lm.train.runs import REPO_ROOT

EXTRA = ["--trainer.max_steps=4", "--model.arch.dropout=0.1"]


class FakeSlurm:
    """sbatch, squeue and scontrol over a job table held here. Each ``tick`` (compare's sleep) moves every job on
    a state: PENDING, RUNNING, then COMPLETED with its run finished (eval.json), or FAILED with a log that says
    why for a run named in ``failing``."""

    def __init__(self, failing: tuple[str, ...] = (), refusing: tuple[str, ...] = ()) -> None:
        self.jobs: dict[str, dict] = {}  # job id -> {"state", "comment", "options", "env", "code"}
        self.next_id = 100
        self.failing, self.refusing = failing, refusing  # runs as "<recipe>/<run directory's name>"
        self.squeue_fails = 0  # the next this many squeue calls fail
        self.most_held = 0  # the most jobs queued or running at once

    def add(self, state: str, run_dir: Path, code: str = "0:0") -> str:
        """A job that is already there (submitted by an earlier compare, or by hand)."""
        self.next_id += 1
        self.jobs[str(self.next_id)] = {"state": state, "comment": str(run_dir), "options": {}, "env": {}, "code": code}
        return str(self.next_id)

    def submitted(self) -> list[dict]:
        return [job for job in self.jobs.values() if job["options"]]

    def __call__(self, argv: list[str], env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
        command, args = argv[0], argv[1:]
        if command == "sbatch":
            options = dict(arg.removeprefix("--").partition("=")[::2] for arg in args[:-1])
            assert args[-1] == str(TRAIN_SBATCH) and "parsable" in options
            if options["job-name"] in self.refusing:
                return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: QOSMaxSubmitJobPerUserLimit")
            job_id = self.add("PENDING", Path(options["comment"]))
            self.jobs[job_id].update(options=options, env=env)
            return subprocess.CompletedProcess(argv, 0, f"{job_id}\n", "")
        if command == "squeue":
            assert "--states=all" in args and "--format=%i %T %k" in args
            if self.squeue_fails:
                self.squeue_fails -= 1
                return subprocess.CompletedProcess(argv, 1, "", "squeue: error: Socket timed out")
            lines = [f"{job_id} {job['state']} {job['comment']}" for job_id, job in self.jobs.items()]
            return subprocess.CompletedProcess(argv, 0, "".join(f"{line}\n" for line in lines), "")
        if command == "scontrol":
            job = self.jobs[args[-1]]
            return subprocess.CompletedProcess(
                argv, 0, f"JobId={args[-1]} JobState={job['state']} ExitCode={job['code']} Restarts=0\n", ""
            )
        raise AssertionError(f"not a SLURM command compare uses: {argv}")

    def tick(self, seconds: float) -> None:
        self.most_held = max(self.most_held, sum(j["state"] in ("PENDING", "RUNNING") for j in self.jobs.values()))
        for job_id, job in self.jobs.items():
            if job["state"] == "PENDING":
                job["state"] = "RUNNING"
            elif job["state"] == "RUNNING":
                run_dir = Path(job["comment"])
                run_dir.mkdir(parents=True, exist_ok=True)  # as fit makes it
                if f"{run_dir.parent.name}/{run_dir.name}" in self.failing:
                    log = Path(job["options"]["output"].replace("%j", job_id))
                    log.write_text(
                        "Traceback ...\nresnorm-lm: error: a broken setting\n"
                        f"resnorm-lm: SLURM job {job_id} failed (exit 2); the error is above\n"
                    )
                    job.update(state="FAILED", code="2:0")
                else:
                    (run_dir / "eval.json").write_text(json.dumps({"finished": True, "step": 4}))
                    job["state"] = "COMPLETED"


def launcher(tmp_path: Path, slurm: FakeSlurm, **options) -> SlurmSweepTrainer:
    """The launcher on ``slurm``, its data preparation (the local launcher's, tested in test_sweep.py) recorded
    in ``prepared`` instead of done."""
    settings = {"max_jobs": 2, "poll_seconds": 5, "partition": "gpu", "time": "01:00:00", "cpus_per_run": 4, **options}
    trainer = SlurmSweepTrainer(
        "smoke", str(tmp_path / "runs"), EXTRA, SlurmOptions(**settings), SlurmQueue(slurm), sleep=slurm.tick
    )
    trainer.prepared = []
    trainer.prepare_data = lambda specs: trainer.prepared.append(list(specs))
    return trainer


def grid(n: int = 4) -> list[RunSpec]:
    return expand_grid(["prenorm-12l", "postnorm-12l"], grid_settings([1e-3, 2e-3], [0.33]), [1])[:n]


def write_run(trainer: SlurmSweepTrainer, spec: RunSpec, finished: bool) -> Path:
    """A run directory as a finished run leaves it, or as an interrupted one does (last.ckpt, no eval.json)."""
    run_dir = trainer.job_run_dir(spec)
    (run_dir / "checkpoints").mkdir(parents=True)
    if finished:
        (run_dir / "eval.json").write_text(json.dumps({"finished": True, "step": 4}))
    else:
        (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"a saved state")
    return run_dir


def test_each_run_is_one_job_of_the_fit_command_the_local_launcher_runs_at_most_max_jobs_at_once(tmp_path, capsys):
    slurm = FakeSlurm()
    trainer = launcher(tmp_path, slurm)
    specs = grid()
    trainer.train_all(specs)
    jobs = slurm.submitted()
    assert len(jobs) == 4 and slurm.most_held == 2  # max_jobs
    assert trainer.prepared == [specs]  # the data once, before the first job
    assert {job["comment"] for job in jobs} == {str(trainer.job_run_dir(s)) for s in specs}  # one job each
    for spec, job in zip(specs, jobs, strict=True):  # submitted in the sweep's order
        run_dir = trainer.job_run_dir(spec)
        assert run_dir.is_absolute() and (run_dir / "eval.json").is_file()
        assert job["options"] == {
            "parsable": "",
            "job-name": f"{spec.recipe}/{run_dir.name}",
            "comment": str(run_dir),
            "output": str(run_dir / "slurm-%j.out"),
            "chdir": str(REPO_ROOT),
            "export": "ALL",
            "ntasks-per-node": "1",
            "cpus-per-task": "4",
            "partition": "gpu",
            "time": "01:00:00",
        }  # fmt: skip (the smoke profile trains on the CPU: no GPU asked for)
        env = job["env"]  # train.sbatch's variables: the local launcher's fit command, word for word
        assert (env["RECIPE"], env["PROFILE"], env["SEED"], env["RESUME"]) == (spec.recipe, "smoke", "1", "")
        assert env["ARGS"].split() == [*trainer.run_options(spec), *EXTRA]
        assert f"--run.tag={spec.tag}" in env["ARGS"] and "--model.optim.lr=" in env["ARGS"]
        assert env["OMP_NUM_THREADS"] == "4"
    out = capsys.readouterr().out
    assert "compare: SLURM: 4 runs to train: 0 already queued or running, 4 to submit" in out
    progress = [line.removeprefix("compare: SLURM jobs: ") for line in out.splitlines() if "SLURM jobs:" in line]
    assert progress == [
        "2 to submit, 2 queued, 0 running, 0 done, 0 failed",
        "2 to submit, 0 queued, 2 running, 0 done, 0 failed",
        "0 to submit, 2 queued, 0 running, 2 done, 0 failed",  # two ended: two more submitted
        "0 to submit, 0 queued, 2 running, 2 done, 0 failed",
        "0 to submit, 0 queued, 0 running, 4 done, 0 failed",
    ]
    assert out.count("compare: finished ") == 4 and "SLURM job 101 (log: " in out


def test_started_again_it_submits_only_runs_neither_finished_nor_queued_or_running(tmp_path, capsys):
    """After an interruption of compare and of a job: one run finished, one held by a running job, one by a
    requeued one, one whose job was cancelled (it left last.ckpt), one never submitted."""
    slurm = FakeSlurm()
    trainer = launcher(tmp_path, slurm, max_jobs=10)
    finished, running, requeued, cancelled, never = specs = [*grid(), RunSpec("prenorm-12l", Setting(3e-3, 0.33), 1)]
    write_run(trainer, finished, finished=True)
    running_job = slurm.add("RUNNING", trainer.job_run_dir(running))
    requeued_job = slurm.add("PENDING", trainer.job_run_dir(requeued))
    write_run(trainer, cancelled, finished=False)
    slurm.add("CANCELLED", trainer.job_run_dir(cancelled), code="0:15")
    slurm.add("RUNNING", tmp_path / "another sweep" / "smoke-seed1")  # someone else's run: not ours to wait for
    todo = trainer.plan(specs, "grid")
    assert todo == specs[1:]
    trainer.train_all(todo)
    submitted = {Path(job["comment"]): job["env"] for job in slurm.submitted()}
    assert submitted.keys() == {trainer.job_run_dir(cancelled), trainer.job_run_dir(never)}
    assert submitted[trainer.job_run_dir(cancelled)]["RESUME"] == "last"  # continues from its last.ckpt
    assert submitted[trainer.job_run_dir(never)]["RESUME"] == ""
    assert trainer.prepared == [[cancelled, never]]
    assert all((trainer.job_run_dir(s) / "eval.json").is_file() for s in specs)  # waited for the held ones too
    out = capsys.readouterr().out
    assert f"4 runs to train: 2 already queued or running (job {running_job}, {requeued_job}), 2 to submit" in out
    assert "0 to submit, 0 queued, 0 running, 4 done, 0 failed" in out
    assert "compare: resuming postnorm-12l (smoke, lr 0.002, warmup 0.33, seed 1): SLURM job" in out
    assert "compare: training prenorm-12l (smoke, lr 0.003, warmup 0.33, seed 1): SLURM job" in out
    trainer.train_all(trainer.plan(specs, "grid"))  # a third time: nothing to do, nothing submitted
    assert len(slurm.submitted()) == 2


def test_a_failed_job_is_reported_with_its_log_and_the_sweep_goes_on(tmp_path, capsys):
    slurm = FakeSlurm(
        failing=("prenorm-12l/smoke-lr0.002-wf0.33-seed1",), refusing=("prenorm-12l/smoke-lr0.001-wf0.33-seed1",)
    )
    trainer = launcher(tmp_path, slurm)
    specs = grid(3)  # prenorm at lr 1e-3 (refused by sbatch), 2e-3 (fails), postnorm at 1e-3 (trains)
    trainer.train_all(specs)
    err = capsys.readouterr().err
    failed_dir = trainer.job_run_dir(specs[1])
    (failed_job,) = [i for i, job in slurm.jobs.items() if job["comment"] == str(failed_dir)]
    assert (
        f"compare: FAILED prenorm-12l (smoke, lr 0.002, warmup 0.33, seed 1): SLURM job {failed_job} FAILED, exit "
        f"code 2:0, its run unfinished; log: {failed_dir / f'slurm-{failed_job}.out'}"
    ) in err
    assert "    resnorm-lm: error: a broken setting" in err  # the log's last lines
    assert (
        "could not submit prenorm-12l (smoke, lr 0.001, warmup 0.33, seed 1): sbatch failed: sbatch: error: "
        "QOSMaxSubmitJobPerUserLimit" in err
    )
    assert (trainer.job_run_dir(specs[2]) / "eval.json").is_file()  # the sweep went on
    assert len(slurm.submitted()) == 2
    trainer.train_all(specs[:2])  # a later round of the same compare: not submitted again
    assert len(slurm.submitted()) == 2
    assert "2 failed earlier in this compare (not submitted again)" in capsys.readouterr().out
    launcher(tmp_path, FakeSlurm(), max_jobs=1).train_all(specs[:2])  # the next compare: both again
    assert all((trainer.job_run_dir(s) / "eval.json").is_file() for s in specs)


def test_squeue_out_of_reach_submits_nothing_and_a_passing_failure_while_waiting_is_waited_out(tmp_path, capsys):
    slurm = FakeSlurm()
    slurm.squeue_fails = 1
    with pytest.raises(SlurmError, match="squeue failed: squeue: error: Socket timed out"):
        launcher(tmp_path, slurm).train_all(grid(1))
    assert not slurm.jobs  # what is queued could not be known: nothing submitted
    trainer, ticks = launcher(tmp_path, slurm), []

    def tick(seconds: float) -> None:  # the poll after the first sleep fails
        slurm.tick(seconds)
        slurm.squeue_fails = int(not ticks)
        ticks.append(seconds)

    trainer.sleep = tick
    trainer.train_all(grid(1))
    assert "squeue failed: squeue: error: Socket timed out; asking again in 5 s" in capsys.readouterr().err
    assert len(slurm.submitted()) == 1 and (trainer.job_run_dir(grid(1)[0]) / "eval.json").is_file()


def test_job_environment_drops_the_slurm_variables_of_an_enclosing_job(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "64")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    env = launcher(tmp_path, FakeSlurm(), cpus_per_run=None).job_environment(grid(1)[0], resume=True)
    assert "SLURM_JOB_ID" not in env and "SLURM_CPUS_PER_TASK" not in env
    assert env["SLURM_CONF"] == "/etc/slurm/slurm.conf" and env["RESUME"] == "last"
    assert env.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")  # no CPUs asked for: as it is


def test_gpus_per_run_follow_the_profile_unless_given_and_each_gpu_is_a_task():
    assert SlurmOptions().sbatch_options(gpus=0) == ["--ntasks-per-node=1"]
    options = SlurmOptions(cpus_per_run=16, account="mylab", sbatch_args=("--qos=normal", "--mem=0"))
    assert options.sbatch_options(gpus=4) == [
        "--ntasks-per-node=4",
        "--gres=gpu:4",
        "--cpus-per-task=4",
        "--account=mylab",
        "--qos=normal",
        "--mem=0",
    ]
    on = {
        profile: SlurmSweepTrainer(profile, "runs", [], SlurmOptions(), SlurmQueue(FakeSlurm())).gpus
        for profile in ("smoke", "cpu", "gpu")
    }
    assert on == {"smoke": 0, "cpu": 0, "gpu": 1}
    assert SlurmSweepTrainer("gpu", "runs", [], SlurmOptions(gpus_per_run=2), SlurmQueue(FakeSlurm())).gpus == 2
    with pytest.raises(SlurmError, match="cannot hold spaces: '--run.root=my runs'"):
        SlurmSweepTrainer("smoke", "my runs", [], SlurmOptions(), SlurmQueue(FakeSlurm()))


def test_the_site_config_file_then_the_command_line(tmp_path, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text(
        'partition: gpu\ntime: "04:00:00"\ngpus_per_run: 1\ncpus_per_run: 8\nmax_jobs: 50\n'
        'sbatch_args: ["--qos=normal"]\n'
    )
    args = compare.parse_args(
        ["--launcher", "slurm", "--slurm-config", str(site), "--slurm-max-jobs", "3", "--slurm-partition", "debug"]
    )
    assert args.slurm == SlurmOptions(
        partition="debug", time="04:00:00", gpus_per_run=1, cpus_per_run=8, max_jobs=3, sbatch_args=("--qos=normal",)
    )
    monkeypatch.setenv("RESNORM_LM_SLURM_CONFIG", str(site))  # the documented places, when none is named
    assert compare.parse_args(["--launcher", "slurm"]).slurm.max_jobs == 50
    monkeypatch.delenv("RESNORM_LM_SLURM_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert compare.parse_args(["--launcher", "slurm"]).slurm == SlurmOptions()  # no file there
    (tmp_path / "config" / "resnorm-lm").mkdir(parents=True)
    (tmp_path / "config" / "resnorm-lm" / "slurm.yaml").write_text(site.read_text())
    assert compare.parse_args(["--launcher", "slurm"]).slurm.max_jobs == 50
    assert compare.parse_args([]).slurm is None  # the local launcher reads no SLURM config


@pytest.mark.parametrize(
    ("content", "argv", "said"),
    [
        ("partitions: gpu\n", [], "unknown setting(s) partitions; valid: partition, account, time"),
        ("time: 4:00:00\n", [], 'write the time limit in quotes, e.g. time: "04:00:00"'),
        ("", ["--slurm-time", "four hours"], "slurm time 'four hours' is none of sbatch's formats"),
        ("", ["--slurm-max-jobs", "0"], "slurm max_jobs must be an integer >= 1, got 0"),
        ("", ["--slurm-cpus", "0"], "slurm cpus_per_run must be an integer >= 1, got 0"),
        ("sbatch_args: [qos=normal]\n", [], "slurm sbatch_args must be sbatch options"),
        ("- gpu\n", [], "a SLURM config is a mapping of settings, got list"),
        ("", ["--jobs", "2"], "--jobs is the local launcher's; with --launcher slurm, --slurm-max-jobs is the most"),
    ],
)
def test_a_bad_setting_fails_before_anything_is_submitted(content, argv, said, tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_text(content)
    with pytest.raises(SystemExit) as stop:
        compare.parse_args(["--launcher", "slurm", "--slurm-config", str(site), *argv])
    assert stop.value.code == 2 and said in capsys.readouterr().err


def test_slurm_options_need_the_slurm_launcher(tmp_path, capsys):
    with pytest.raises(SystemExit):
        compare.parse_args(["--slurm-partition", "gpu", "--slurm-config", str(tmp_path / "site.yaml")])
    assert "--slurm-partition, --slurm-config: only with --launcher slurm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.parse_args(["--launcher", "slurm", "--slurm-config", str(tmp_path / "nowhere.yaml")])
    assert f"no SLURM config file at {tmp_path / 'nowhere.yaml'}" in capsys.readouterr().err


def test_make_compare_passes_its_launcher_to_compare():
    def dry_run(*variables: str) -> str:  # make -n: the commands, not run
        return subprocess.run(
            ["make", "-n", "compare", "RECIPES=prenorm-12l", *variables],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout

    assert "--jobs 1 --launcher local" in dry_run()
    assert "--jobs 1 --launcher slurm" in dry_run("LAUNCHER=slurm")
