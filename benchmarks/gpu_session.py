"""The GPU session: every measurement that needs a GPU, in stages that each fit one 10-minute device command.

    bash benchmarks/gpu_session.sh prepare                      # once, on a networked machine (the venv's python)
    bash benchmarks/gpu_session.sh quick                        # the first command whenever a GPU is lent
    bash benchmarks/gpu_session.sh kernels                      # then each line below as one command
    bash benchmarks/gpu_session.sh check e2e
    bash benchmarks/gpu_session.sh placements profile
    bash benchmarks/gpu_session.sh training
    bash benchmarks/gpu_session.sh depth -- --recipes ... --depths 48 --lrs ...    # rounds, as long as time lasts
    bash benchmarks/gpu_session.sh suite -- placements-12l [--jobs N]              # chunks, as long as time lasts
    bash benchmarks/gpu_session.sh --dry-run quick kernels ...  # on a CPU: every stage's plumbing, tiny sizes

The GPU machine (torch, triton and lightning preinstalled, no network) gets the wheels it lacks (.whl/), the data
cache (.devcache/) and finished runs (.devseed/) through the device tool's carry list; ``prepare`` makes all three.

Stages (GPU unless said):
  prepare     on a networked machine: the wheels, the Shakespeare data at vocab 32768 (gpu profile) and 8192 (cpu
              profile), and the finished fp32 cpu-profile runs of docs/results/*/run-files*/ as .devseed/*.tar.gz
  quick       about 5 minutes: `fit` against the bare loop with compile off and on, MFU of both, the 768-wide
              Add & Norm row against torch eager and torch.compile, triton against torch in the compiled step
  check       tests/test_triton_gpu.py: triton_op under Inductor, opcheck, autotuned parity and determinism
  kernels     benchmarks/bench_kernels.py: the Add & Norm table at widths 768-8192, bf16, host time per call
  training    bench_training.py --profile gpu: `fit` against the bare loop, two alternating rounds, MFU
  placements  bench_training.py: compiled step time of prenorm and postnorm, torch and triton backends
  e2e         what `make train RECIPE=prenorm-12l PROFILE=gpu` runs, compiled, triton backend, on Shakespeare,
              shortened to --e2e-steps optimizer steps, through evaluation and generation
  profile     benchmarks/profile_step.py: the compiled step's GPU time by kind, triton and torch backends
  depth       one round of `python -m resnorm_lm compare` (the arguments after --) in the runs root; the round
              stops by its budget (its runs save a checkpoint on SIGTERM and resume in the next round on a warm
              machine), renders the tables, measures the layer contribution while the checkpoints are there,
              and brings back every finished run's small files (depth-runs-*.tar.gz: put them in .devseed/ for
              the next round on a fresh machine)
  suite       one chunk of a pre-registered suite (`python -m resnorm_lm suite NAME`, recipes/suites/NAME.yaml):
              its runs in <runs root>/suites/NAME (a root of their own: GPU runs never share a table with CPU
              runs), fp32 with TF32 off, on the GPU, --jobs (default 12) at a time; stopped by its budget and
              resumed as depth is; renders the table and brings back every finished run's small files
              (suite-NAME-runs-*.tar.gz: put them in .devseed/ for the next chunk on a fresh machine); carried
              runs of another arithmetic than this GPU's (another kind of GPU) are set aside first, said in the log

Output: $OUT/<stage>/ (OUT: the device tool's output folder; ./gpu-out otherwise) holds each stage's results
and log.txt, flat; $OUT/session.txt the device, versions and every step's status. Files beyond the 8 that come
back are packed into <stage>/<stage>-files.tar.gz (benchmarks/device_files.py). A failing step is reported
and the next one runs. The invocation keeps to --limit-s (default 570 s of the device's 600); each stage gets
a share by its expected length, each step a share of its stage, and a step still running at the end of its
share gets SIGTERM, then SIGKILL.

--dry-run runs every stage on this CPU at tiny sizes (the smoke profile, a generated corpus, no network):
CUDA-only steps still run their plumbing where they have a CPU path and report "skipped: no CUDA".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import device_files, run_files  # noqa: E402
from resnorm_lm.train.precision import TF32_ENV  # noqa: E402
from resnorm_lm.train.recipes import RECIPES_DIR  # noqa: E402
from resnorm_lm.train.runs import RunDir  # noqa: E402

DEVICE_STAGES = ("quick", "check", "kernels", "training", "placements", "e2e", "profile", "depth", "suite")
# expected seconds of each stage on an H100: an invocation's time is shared among its stages by these
WEIGHTS = {
    "quick": 300,
    "check": 240,
    "kernels": 480,
    "training": 300,
    "placements": 300,
    "e2e": 240,
    "profile": 240,
    "depth": 570,
    "suite": 540,  # alone: one chunk in one command of at most 9 minutes
}
KERNEL_WIDTHS = [768, 1024, 2048, 4096, 8192]
WHEELS = [
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "jsonargparse==4.53.0",
    "docstring_parser==0.18.0",
    "typeshed_client==2.14.0",
]
DEPTH_PROFILE, DEPTH_PRECISION = "cpu", "32-true"  # the depth sweep: cpu profile, fp32 (as the 12-layer sweep)
DEPTH_TRAIN_ARGS = [
    "--trainer.accelerator=gpu",
    f"--trainer.precision={DEPTH_PRECISION}",
    "--trainer.enable_progress_bar=false",
]
DEPTH_RESERVE_S = 150  # of a depth round: rendering the tables, the layer contribution and packing the runs
SUITE_TRAIN_ARGS = ["--trainer.accelerator=gpu", "--trainer.enable_progress_bar=false"]  # the machine's, not the
# protocol's (suite refuses those): precision, horizon and the rest are the suite file's
GPU_SUITE_RESULTS = "docs/results/suites-h100"  # the H100's suite tables; prepare carries their runs
SUITE_MIN_S = 60  # a later suite of one suite command starts only with this much time left
SUITE_RESERVE_S = 60  # of a suite chunk: the stopped runs saving (4 s on the H100), the table (16 s), packing;
# the picks' test split is evaluated while the chunk trains (suite_runner.test_while_there), not here
# the dry run's suite: two smoke runs of 4 steps, one seed each (a tuned budget needs at least 3 LRs a recipe)
DRY_SUITE = """about: the suite stage's dry run
design: seeds
profile: smoke
recipes: [prenorm-12l, postnorm-12l]
reference: prenorm-12l
arithmetic: native
train: {trainer.max_steps: 4}
pilot: {settings: {prenorm-12l: {lr: 0.003, warmup: 0.25}, postnorm-12l: {lr: 0.001, warmup: 0.25}}, seeds: [1]}
"""
CONTRIBUTION_TOKENS = 16_384  # compare's --contribution-tokens default (resnorm_lm.analysis.block_measurements)
PUBLISH_RESERVE_S = 10  # kept back from the stages: laying out $OUT
MIN_STEP_S = 15  # a step with less time than this is skipped (a child needs seconds to import torch)
# the lines that carry the figures (printed again at the end: the output's tail comes back with the reply)
HEADLINES = re.compile(
    r"lightning_vs_bare_ratio|MFU|^(lightning|bare) +(true|false) |layernorm +yes +bfloat16 +768 |"
    r"^  \w+ +(torch|triton) +compile=|\b\d+ (passed|failed|errors?)\b|^RESULT |^compare: (grid|seeds)|"
    r"^layer contribution: measured|^step .* tokens/s|no CUDA|time budget|^suite [\w.-]+: (complete|PARTIAL)"
)
HEADLINES_PER_STAGE = 60


class Budget:
    """A deadline, and shares of what is left of it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def share(self, weight: float, *later: float) -> float:
        """This part's share of the time left, by its weight against its own and the later parts'."""
        return max(0.0, self.left()) * weight / (weight + sum(later))


@dataclass
class StepResult:
    status: str  # "ok", "failed (exit N)", "cut at its N s budget", "skipped: ..."
    seconds: float


@dataclass
class Session:
    """One invocation: where things go, which interpreter and sizes, what ran."""

    out: Path
    scratch: Path
    dry: bool
    runs_root: Path
    seed_dir: Path
    e2e_steps: int
    kernel_widths: list[int]
    compare_args: list[str]  # after --, for depth
    suite_args: list[str] = field(default_factory=list)  # after --, for suite
    py: str = sys.executable
    env: dict = field(default_factory=lambda: dict(os.environ))
    cuda: bool = False
    header: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # every step's status, for session.txt
    done: list[device_files.StageFiles] = field(default_factory=list)
    failed: int = 0  # steps that failed (a step cut at its budget keeps what it wrote: no failure)
    references: dict = field(default_factory=dict)  # this GPU's reference fingerprint, by profile
    log_file: object = None

    # ---------------------------------------------------------------- running a child under a budget

    def say(self, line: str) -> None:
        print(line, flush=True)
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def child(self, argv: list[str], seconds: float, env: dict | None = None, grace_s: float = 20) -> int | None:
        """Run ``argv`` in its own process group, its output to the screen and the stage's log; after
        ``seconds``, SIGTERM to the group, SIGKILL after ``grace_s``. Returns the exit code, None if cut."""
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        reader = threading.Thread(target=lambda: [self.say(line.rstrip("\n")) for line in proc.stdout])
        reader.start()
        cut = False
        try:
            proc.wait(timeout=max(1.0, seconds))
        except subprocess.TimeoutExpired:
            cut = True
            signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        except BaseException:  # the session itself stopped (SIGTERM, Ctrl-C): leave no process group behind
            signal_group(proc.pid, signal.SIGKILL)
            raise
        wait_for_group(proc.pid, grace_s if cut else 5)  # grandchildren saving (compare's fits: compare waits)
        reader.join(timeout=10)
        return None if cut else proc.returncode

    def step(
        self,
        stage: str,
        name: str,
        argv: list[str],
        seconds: float,
        needs_cuda: bool = False,
        env: dict | None = None,
        grace_s: float = 20,
        budget_flag: bool = False,
        note: str = "",
    ) -> StepResult:
        """One child of a stage, reported as ok (with ``note``), failed, cut or skipped; a failure never stops
        the stage. ``needs_cuda``: without CUDA it reports "skipped: no CUDA" once its CPU path has run."""
        if seconds < MIN_STEP_S:
            return self.record(stage, name, StepResult(f"skipped: {seconds:.0f} s left of the budget", 0.0))
        if budget_flag:  # the child winds down by itself a little before it would be stopped
            argv = [*argv, "--budget-s", str(int(seconds - min(30, 0.1 * seconds)))]
        self.say(f"=== {stage}/{name}: {' '.join(argv)} (budget {seconds:.0f} s, {utc_now()})")
        t0 = time.monotonic()
        code = self.child(argv, seconds, env, grace_s)
        took = time.monotonic() - t0
        if code is None:
            result = StepResult(f"cut at its {seconds:.0f} s budget", took)
        elif code != 0:
            result = StepResult(f"failed (exit {code})", took)
        elif needs_cuda and not self.cuda:
            result = StepResult("skipped: no CUDA (its CPU plumbing ran)", took)
        else:
            result = StepResult(f"ok{f' ({note})' if note else ''}", took)
        return self.record(stage, name, result)

    def record(self, stage: str, name: str, result: StepResult) -> StepResult:
        self.failed += result.status.startswith("failed")
        line = f"{stage}/{name}: {result.status} ({result.seconds:.0f} s)"
        self.lines.append(line)
        self.say(f"=== {line}")
        return result

    # ---------------------------------------------------------------- sizes: the GPU's or the dry run's tiny ones

    @property
    def bench_profile(self) -> str:
        return "smoke" if self.dry else "gpu"

    def bench_training(self, *args: str, results: Path) -> list[str]:
        data = ["--data-files", self.corpus] if self.dry else []
        return [
            self.py,
            "benchmarks/bench_training.py",
            "--profile",
            self.bench_profile,
            *args,
            "--results",
            str(results),
            *data,
        ]

    def compile_choice(self, wanted: str) -> str:
        """torch.compile as asked on the GPU; off in the dry run (Inductor on a CPU takes minutes, measures
        nothing here, and the flag's plumbing is the same)."""
        return "off" if self.dry else wanted

    @property
    def dry_note(self) -> str:
        return "compile off: the dry run compiles nothing" if self.dry else ""

    @property
    def corpus(self) -> str:
        return str(self.scratch / "corpus" / "*.txt")


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for_group(pgid: int, seconds: float) -> None:
    """Wait until no process of group ``pgid`` is left, at most ``seconds``; then SIGKILL what remains."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.2)
    signal_group(pgid, signal.SIGKILL)


# ---------------------------------------------------------------------- the stages


def stage_quick(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    p = s.bench_profile
    s.step(
        "quick",
        "lightning-vs-bare",
        s.bench_training("--only", "throughput", "--compile", s.compile_choice("both"), results=d),
        budget.share(170, 40, 90),
        budget_flag=True,
        note=s.dry_note,
    )
    s.step(
        "quick",
        "kernel-768",
        [
            s.py,
            "benchmarks/bench_kernels.py",
            "--hidden",
            "64" if s.dry else "768",
            "--rows",
            "64" if s.dry else "16384",
            "--dtypes",
            "bfloat16",
            "--norms",
            "layernorm",
            "--residual",
            "yes",
            "--skip-host-time",
            "--csv",
            str(d / "kernels.csv"),
        ],
        budget.share(40, 90),
        needs_cuda=True,
        budget_flag=True,
    )
    s.step(
        "quick",
        "triton-vs-torch",
        s.bench_training(
            "--only", "placements", "--compile", s.compile_choice("on"), "--placements", "prenorm", results=d
        ),
        budget.share(90),
        needs_cuda=True,
        budget_flag=True,
    )
    return [
        (f"training_{p}.csv", d / f"training_{p}.csv"),
        ("kernels.csv", d / "kernels.csv"),
        (f"placements_{p}.csv", d / f"placements_{p}.csv"),
        ("log.txt", d / "log.txt"),
    ]


def stage_check(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    junit = d / "junit.xml"
    # the conftest's defaults (the interpreter on, no GPU visible) overridden
    s.step(
        "check",
        "gpu-tests",
        [s.py, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "tests/test_triton_gpu.py"],
        budget.share(1),
        needs_cuda=True,
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    return [("log.txt", d / "log.txt"), ("junit.xml", junit)]


def stage_kernels(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    widths = ["64", "96"] if s.dry else [str(w) for w in s.kernel_widths]
    s.step(
        "kernels",
        "table",
        [
            s.py,
            "benchmarks/bench_kernels.py",
            "--hidden",
            *widths,
            "--dtypes",
            "bfloat16",
            *(["--rows", "64"] if s.dry else []),
            "--csv",
            str(d / "kernels.csv"),
        ],
        budget.share(1),
        needs_cuda=True,
        budget_flag=True,
    )
    return [("kernels.csv", d / "kernels.csv"), ("log.txt", d / "log.txt")]


def stage_training(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    s.step(
        "training",
        "lightning-vs-bare",
        s.bench_training("--only", "throughput", "--compile", s.compile_choice("both"), "--rounds", "2", results=d),
        budget.share(1),
        budget_flag=True,
        note=s.dry_note,
    )
    return [(f"training_{s.bench_profile}.csv", d / f"training_{s.bench_profile}.csv"), ("log.txt", d / "log.txt")]


def stage_placements(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    s.step(
        "placements",
        "step-times",
        s.bench_training(
            "--only",
            "placements",
            "--compile",
            s.compile_choice("on"),
            "--placements",
            "prenorm",
            "postnorm",
            results=d,
        ),
        budget.share(1),
        needs_cuda=True,
        budget_flag=True,
    )
    return [(f"placements_{s.bench_profile}.csv", d / f"placements_{s.bench_profile}.csv"), ("log.txt", d / "log.txt")]


def stage_e2e(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    # `make train RECIPE=prenorm-12l PROFILE=gpu ARGS="..."` runs exactly this (the Makefile), with .venv's python
    if s.dry:
        sized = [
            "--profile",
            "smoke",
            "--data.corpus=text",
            f"--data.files=[{s.corpus}]",
            "--model.arch.norm_backend=torch",
            "--model.compile=false",
            "--trainer.max_steps=4",
        ]
    else:
        sized = [
            "--profile",
            "gpu",
            "--data.corpus=shakespeare",
            "--model.arch.norm_backend=triton",
            "--model.compile=true",
            f"--trainer.max_steps={s.e2e_steps}",
            f"--trainer.val_check_interval={s.e2e_steps * 4}",
        ]
    s.step(
        "e2e",
        "make-train",
        [
            s.py,
            "-m",
            "resnorm_lm",
            "fit",
            "--recipe",
            "prenorm-12l",
            "--seed_everything",
            "1",
            *sized,
            "--trainer.enable_progress_bar=false",
            f"--run.root={d / 'runs'}",
        ],
        budget.share(1),
        needs_cuda=True,
        grace_s=60,
    )
    run = RunDir(d / "runs" / "prenorm-12l" / f"{s.bench_profile}-seed1")
    files = [run.summary_path, run.metrics_path, d / "log.txt", run.manifest_path, run.config_path]
    return [(path.name, path) for path in files]


def stage_profile(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    for backend in ("triton", "torch"):
        # --smoke: a tiny model, the torch backend, on the CPU; and no compile (Inductor on a CPU takes a minute)
        sized = ["--smoke", "--no-compile"] if s.dry else ["--backend", backend]
        s.step(
            "profile",
            backend,
            [s.py, "benchmarks/profile_step.py", *sized, "--out", str(d / backend)],
            budget.share(1, 1) if backend == "triton" else budget.share(1),
            needs_cuda=True,
        )
    return (
        [(f"summary-{b}.json", d / b / "summary.json") for b in ("triton", "torch")]
        + [(f"kernels-{b}.txt", d / b / "kernels.txt") for b in ("triton", "torch")]
        + [("log.txt", d / "log.txt")]
        + [(f"trace-{b}.json.gz", d / b / "trace.json.gz") for b in ("triton", "torch")]
    )


def stage_depth(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    args = compare_arguments(s)
    profile = args[args.index("--profile") + 1]
    tokens = (
        int(args[args.index("--contribution-tokens") + 1]) if "--contribution-tokens" in args else CONTRIBUTION_TOKENS
    )
    seeds = [p for p in sorted(s.seed_dir.glob("*.tar.gz")) if not p.name.startswith("suite-")]  # suite's own
    unpack_seed_runs(s, "depth", seeds, s.runs_root)
    compare = [s.py, "-m", "resnorm_lm", "compare", *args]
    reserve = min(DEPTH_RESERVE_S, 0.4 * budget.left())
    sweep = s.step("depth", "sweep", compare, budget.left() - reserve, grace_s=60)
    if sweep.status != "ok" and run_files.finished_runs(s.runs_root):  # the tables and the picks' layer
        s.step("depth", "render", [*compare, "--no-train"], budget.share(2, 1), grace_s=10)  # contribution
    if tokens > 0:  # compare's --contribution-tokens 0: not measured
        s.step(
            "depth",
            "contributions",
            [
                s.py,
                "benchmarks/run_files.py",
                "contributions",
                str(s.runs_root),
                "--tokens",
                str(tokens),
                "--seconds",
                str(int(max(0, budget.left() - 30))),
            ],
            budget.left() - 15,
            grace_s=10,
        )
    parts = pack_finished_runs(s, "depth", s.runs_root, d, "depth-runs")
    results = d / "results" / profile
    if results.is_dir():
        with tarfile.open(d / "results.tar.gz", "w:gz") as tar:
            tar.add(results, arcname="results")
    return [
        *[(p.name, p) for p in parts],
        ("compare.md", results / "compare.md"),
        ("depth.md", results / "depth.md"),
        ("layer_contribution.md", results / "layer_contribution.md"),
        ("log.txt", d / "log.txt"),
        ("results.tar.gz", d / "results.tar.gz"),
    ]


def compare_arguments(s: Session) -> list[str]:
    """compare's arguments for a depth round: the user's, with the runs root, the results folder, the profile
    and jobs (unless given) and the training arguments of this machine (GPU, fp32) added."""
    given = []  # --opt=value as --opt value, so that options are found by name (not inside --train-args' value)
    for i, arg in enumerate(s.compare_args):
        value_of_train_args = i > 0 and s.compare_args[i - 1] == "--train-args"
        given += arg.split("=", 1) if arg.startswith("--") and "=" in arg and not value_of_train_args else [arg]
    if not given and not s.dry:
        raise SystemExit(
            "gpu_session: depth: give compare's arguments after --, e.g. depth -- --recipes "
            "prenorm-12l --depths 48 --lrs 5e-4 1e-3 --warmups 0.4 --seeds 1 2 3 "
            "(docs/depth.md)"
        )
    if not given:  # the dry run's tiny sweep
        given = [
            "--recipes",
            "prenorm-12l",
            "--depths",
            "2",
            "--lrs",
            "1e-3",
            "3e-3",
            "--warmups",
            "0.33",
            "--seeds",
            "1",
        ]
    for owned in ("--root", "--results"):
        if owned in given:
            raise SystemExit(f"gpu_session: depth sets {owned} itself (the runs root and $OUT): leave it out")
    train = DEPTH_TRAIN_ARGS
    if s.dry:
        train = ["--trainer.accelerator=cpu", *DEPTH_TRAIN_ARGS[1:], "--data.corpus=text", f"--data.files=[{s.corpus}]"]
    if "--train-args" in given:
        i = given.index("--train-args")
        train = [*train, *given[i + 1].split()]
        del given[i : i + 2]
    defaults = [] if "--profile" in given else ["--profile", "smoke" if s.dry else DEPTH_PROFILE]
    defaults += [] if "--jobs" in given else ["--jobs", "1" if s.dry else "12"]
    return [
        *given,
        *defaults,
        "--root",
        str(s.runs_root),
        "--results",
        str(s.scratch / "depth" / "results"),
        "--train-args",
        " ".join(train),
    ]


def stage_suite(s: Session, d: Path, budget: Budget) -> list[tuple[str, Path]]:
    """The suites named after --, in their order: each trains with the time the earlier ones left, so that a
    suite that completes early hands the rest of the command to the next (none starts with under a minute)."""
    suites, jobs, reuse = suite_arguments(s)
    sources = []  # the reuse suites' GPU roots, their carried runs unpacked once for every suite of the command
    for other in reuse:
        sources.append(s.runs_root / "suites" / other)
        unpack_seed_runs(s, "suite", sorted(s.seed_dir.glob(f"suite-{other}-runs*.tar.gz")), sources[-1])
        set_aside_other_arithmetic(s, sources[-1], device_reference(s, other))
    files = []
    for k, suite in enumerate(suites):
        if k and budget.left() < SUITE_MIN_S:
            s.say(f"=== suite: under {SUITE_MIN_S} s left: {', '.join(map(str, suites[k:]))} wait for the next command")
            break
        files += suite_chunk(s, d, budget, suite, jobs, sources)
    return [*files, ("log.txt", d / "log.txt")]


def suite_chunk(
    s: Session, d: Path, budget: Budget, suite: str | None, jobs: int, sources: list[Path]
) -> list[tuple[str, Path]]:
    """One suite's next chunk: its earlier runs unpacked, trained until done or out of time (taking the runs of
    the other ``sources`` roots that are its own: suite --reuse), its table rendered, its finished runs packed;
    the files that come back."""
    if suite is None:  # the dry run's own tiny suite
        suite = str(s.scratch / "dry-suite.yaml")
        Path(suite).write_text(DRY_SUITE)
    name = Path(suite).stem
    root = s.runs_root / "suites" / name
    unpack_seed_runs(s, "suite", sorted(s.seed_dir.glob(f"suite-{name}-runs*.tar.gz")), root)
    set_aside_other_arithmetic(s, root, device_reference(s, suite))
    reused = [arg for r in sources if r != root and run_files.finished_runs(r) for arg in ("--reuse", str(r))]
    machine = SUITE_TRAIN_ARGS
    if s.dry:
        machine = [
            "--trainer.accelerator=cpu",
            *SUITE_TRAIN_ARGS[1:],
            "--data.corpus=text",
            f"--data.files=[{s.corpus}]",
        ]
    argv = [s.py, "-m", "resnorm_lm", "suite", suite, "--root", str(root), "--results", str(d / "results")]
    argv += ["--jobs", str(jobs), "--train-args", " ".join(machine)]
    fp32 = {TF32_ENV: "off"}  # full fp32 matmuls (the portable arithmetic's setting too): one GPU arithmetic a table
    reserve = min(SUITE_RESERVE_S, 0.4 * budget.left())
    trained = s.step("suite", f"train-{name}", [*argv, *reused], budget.left() - reserve, env=fp32, grace_s=60)
    if trained.status != "ok" and run_files.finished_runs(root):  # stopped: the table of what finished
        s.step("suite", f"render-{name}", [*argv, "--no-train"], budget.left() - 15, env=fp32, grace_s=10)
    parts = pack_finished_runs(s, "suite", root, d, f"suite-{name}-runs")
    results = d / "results" / name
    return [
        *[(p.name, p) for p in parts],
        (f"{name}.md", results / f"{name}.md"),
        (f"{name}-table.csv", results / "table.csv"),
    ]


def suite_arguments(s: Session) -> tuple[list[str | None], int, list[str]]:
    """The suite stage's arguments (after --): one or more suites, by name or file, --jobs (default 12 on the
    GPU) and --reuse SUITE (repeatable: a suite whose GPU runs these may take, as designs-12l takes
    placements-12l's pre-norm and post-norm); [None] for the dry run without a suite (its tiny suite). A mistake
    stops the session before any stage."""
    parser = argparse.ArgumentParser(prog="gpu_session.sh suite --", add_help=False)
    parser.add_argument("suites", nargs="*")
    parser.add_argument("--jobs", type=int, default=1 if s.dry else 12)
    parser.add_argument("--reuse", action="append", default=[], metavar="SUITE")
    args = parser.parse_args(s.suite_args)
    available = sorted(p.stem for p in (RECIPES_DIR / "suites").glob("*.yaml"))
    if not args.suites and not s.dry:
        raise SystemExit(
            "gpu_session: suite: give the suite's name after --, e.g. suite -- placements-12l [--jobs 12] "
            f"(recipes/suites/: {', '.join(available)})"
        )
    for suite in [*args.suites, *args.reuse]:
        if suite not in available and not Path(suite).is_file():
            raise SystemExit(f"gpu_session: suite: {suite!r}: a suite of recipes/suites/ ({', '.join(available)})")
    if len({Path(suite).stem for suite in args.suites}) < len(args.suites):
        raise SystemExit(f"gpu_session: suite: a suite named twice: {' '.join(args.suites)}")
    if args.jobs < 1:
        raise SystemExit(f"gpu_session: suite: --jobs must be >= 1, got {args.jobs}")
    return args.suites or [None], args.jobs, [Path(r).stem for r in args.reuse]


def unpack_seed_runs(s: Session, stage: str, tarballs: list[Path], root: Path) -> None:
    """Finished runs of earlier commands (carried in .devseed/) into ``root``, keeping the runs already there."""
    root.mkdir(parents=True, exist_ok=True)
    added, kept = run_files.unpack_runs(tarballs, root)
    s.say(
        f"=== {stage}: {added} finished run(s) unpacked from {len(tarballs)} tarball(s) in {s.seed_dir} into "
        f"{root}; {kept} already there (kept)"
    )


def device_reference(s: Session, suite: str) -> str | None:
    """This GPU's reference fingerprint at the suite's profile, as the suite's runs compute (fp32, TF32 off:
    ``python -m resnorm_lm.train.arithmetic --device cuda``), probed once a profile; None without CUDA (the dry
    run: its CPU runs carry no other GPU's) or where the probe fails (said)."""
    from resnorm_lm.analysis.reuse import arithmetic_probe
    from resnorm_lm.analysis.suite import load

    if not s.cuda:
        return None
    spec = load(suite)
    if spec.profile not in s.references:
        try:
            probe = arithmetic_probe(spec, [], "cuda", env={**s.env, TF32_ENV: "off"})
        except RuntimeError as err:
            s.say(f"=== suite: {err}; carried runs kept as they are")
            return None
        s.references[spec.profile] = probe["reference"]
    return s.references[spec.profile]


def set_aside_other_arithmetic(s: Session, root: Path, here: str | None) -> None:
    """Move the finished runs under ``root`` computed in another arithmetic than ``here`` (another kind of GPU's,
    carried in .devseed/) to ``<root>.other-arithmetic/``, saying so: this GPU's runs make a table of their own,
    which they could not share with them (``suite`` refuses a mixed table, and ``--reuse`` stops rather than
    start one again)."""
    from collections import Counter

    from resnorm_lm.analysis.evidence import segment_arithmetics

    if here is None:
        return
    aside, moved = root.with_name(root.name + ".other-arithmetic"), Counter()
    for run_dir in run_files.finished_runs(root):
        theirs = segment_arithmetics(run_dir)
        if theirs != {here}:
            target = aside / run_dir.parent.name / run_dir.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(run_dir), str(target))
            moved.update(theirs)
    if moved:
        theirs = ", ".join(f"{reference} ({n})" for reference, n in moved.most_common())
        s.say(
            f"=== suite: {sum(moved.values())} carried run(s) of {root.name} computed in another arithmetic ({theirs}) "
            f"than this GPU's ({here}) set aside in {aside}: this GPU's runs make a table of their own (unpack "
            "what comes back into docs/results/suites-<this gpu>/, not beside the carried runs' table)"
        )


def pack_finished_runs(s: Session, stage: str, root: Path, d: Path, stem: str) -> list[Path]:
    """The small files of every finished run under ``root``, in ``d/<stem>-N.tar.gz``; the end of the log of each
    run that ended in an error, said."""
    for run_dir in run_files.failed_runs(root):
        log = run_files.tail(run_dir / "train.log")
        s.say(f"=== {stage}: {run_dir} ended in an error; the end of its train.log:\n{log}")
    stopped = run_files.stopped_runs(root)
    if stopped:
        s.say(
            f"=== {stage}: {len(stopped)} run(s) stopped before their first checkpoint, no error in their logs "
            f"(the budget's SIGTERM, or a kill): they start from step 0 next time: {', '.join(map(str, stopped))}"
        )
    parts = run_files.pack_runs(root, d, stem)
    n_runs = len(run_files.finished_runs(root))
    s.say(
        f"=== {stage}: {n_runs} finished run(s), their small files in {', '.join(p.name for p in parts) or 'nothing'}"
        " (no checkpoint): put them in .devseed/ for the next round"
    )
    return parts


STAGES = {
    "quick": stage_quick,
    "check": stage_check,
    "kernels": stage_kernels,
    "training": stage_training,
    "placements": stage_placements,
    "e2e": stage_e2e,
    "profile": stage_profile,
    "depth": stage_depth,
    "suite": stage_suite,
}


# ---------------------------------------------------------------------- set-up, publishing, prepare


def set_up(s: Session) -> None:
    """The children's environment: offline wheels and the carried data cache (GPU), or the dry run's own corpus
    and cache; then which torch and device are there."""
    s.env.update(PYTHONUNBUFFERED="1", TRITON_INTERPRET="0")
    path = [str(ROOT)]
    if s.dry:
        s.env["RESNORM_LM_CACHE"] = str(s.scratch / "cache")
        write_corpus(s.scratch / "corpus")
    else:
        wheels = sorted((ROOT / ".whl").glob("*.whl"))
        if wheels and not imports(s, "datasets, jsonargparse"):
            pip = [
                s.py,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                "/tmp/site",
                *map(str, wheels),
            ]
            if subprocess.run(pip).returncode != 0:
                raise SystemExit("gpu_session: installing .whl/ failed")
        path.insert(0, "/tmp/site")
        if (ROOT / ".devcache").is_dir():
            s.env["RESNORM_LM_CACHE"] = str(ROOT / ".devcache")
        else:
            print(
                "gpu_session: no .devcache/ here: run 'bash benchmarks/gpu_session.sh prepare' on a networked "
                "machine and carry it",
                file=sys.stderr,
            )
    s.env["PYTHONPATH"] = os.pathsep.join(path + ([s.env["PYTHONPATH"]] if s.env.get("PYTHONPATH") else []))
    if not imports(s, "datasets, jsonargparse"):
        raise SystemExit("gpu_session: datasets/jsonargparse are missing: run the prepare stage, carry .whl/")
    probe = subprocess.run([s.py, "-c", PROBE], env=s.env, capture_output=True, text=True, cwd=ROOT)
    if probe.returncode != 0:
        raise SystemExit(f"gpu_session: {s.py} cannot import torch and lightning:\n{probe.stderr[-2000:]}")
    facts = json.loads(probe.stdout.strip().splitlines()[-1])
    s.cuda = facts.pop("cuda")
    smi = shutil.which("nvidia-smi")
    gpu = (
        subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if smi
        else ""
    )
    commit = subprocess.run(["git", "log", "-1", "--format=%h %s"], cwd=ROOT, capture_output=True, text=True)
    s.header += [
        f"started {utc_now()}{' (dry run: tiny sizes on the CPU)' if s.dry else ''}",
        f"device: {facts.pop('device')}{f' ({gpu})' if gpu else ''}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in facts.items()),
        f"commit: {commit.stdout.strip() or 'unknown (no git here)'}",
    ]
    for line in s.header:
        print(line, flush=True)


PROBE = """import json, platform, torch, lightning
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = None
cuda = torch.cuda.is_available()
print(json.dumps({"cuda": cuda, "device": torch.cuda.get_device_name() if cuda else "cpu (no CUDA)",
                  "python": platform.python_version(), "torch": torch.__version__, "triton": tv,
                  "lightning": lightning.__version__}))"""


def imports(s: Session, modules: str) -> bool:
    env = {**s.env, "PYTHONPATH": os.pathsep.join(["/tmp/site", str(ROOT), s.env.get("PYTHONPATH", "")])}
    return subprocess.run([s.py, "-c", f"import {modules}"], env=env, capture_output=True).returncode == 0


def write_corpus(folder: Path, n_files: int = 16, words: int = 600) -> None:
    """The dry run's corpus: pseudo-text in which each word is followed by one of two others (learnable)."""
    vocab = (
        "the king queen lord night day love sword crown heart blood fair sweet old young come go speak "
        "hear see know think make give take stand fall rise sleep wake live my thy his her our this "
        "that"
    ).split()
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        word, text = rng.randrange(len(vocab)), []
        for _ in range(words):
            text.append(vocab[word])
            word = (7 * word + 1 + rng.randrange(2)) % len(vocab)
        (folder / f"part{i:02d}.txt").write_text(" ".join(text) + "\n")


def publish(s: Session) -> None:
    """$OUT laid out anew from every stage done so far (each stage's files flat, packed where too many), and
    session.txt: the device, the steps' statuses, what was packed or left out, and the layout check."""
    for stage in s.done:
        stage.files = [(name, path) for name, path in stage.files if path.is_file()]
    notes = device_files.publish(s.done, s.out, device_files.MAX_FILES - 1) if s.done else []  # and session.txt
    text = "\n".join([*s.header, "", *s.lines, "", *notes]) + "\n"
    (s.out / "session.txt").write_text(text)
    problems = device_files.layout_problems(s.out)
    if problems:  # should not happen: publish keeps to the limits
        (s.out / "session.txt").write_text(text + "\n".join(f"layout: {p}" for p in problems) + "\n")
    for note in notes:
        print(f"=== publish: {note}", flush=True)
    for problem in problems:
        print(f"=== publish: layout: {problem}", flush=True)


def headlines(s: Session) -> None:
    """The lines that carry the figures, from every stage's log, at the end of the output (its tail comes back)."""
    print(f"\n=== {len(s.done)} stage(s) done, {utc_now()}; headlines:", flush=True)
    for stage in s.done:
        log = s.scratch / stage.stage / "log.txt"
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        found = [line for line in lines if HEADLINES.search(line) and not line.startswith("=== ")]
        found = [line if len(line) < 400 else f"{line[:300]} ..." for line in found]  # suite's last line lists files
        for line in found[:HEADLINES_PER_STAGE]:
            print(f"{stage.stage}: {line}")
    print("\n".join(s.lines))
    print(f"$OUT ({s.out}): " + ", ".join(str(p.relative_to(s.out)) for p in sorted(s.out.rglob("*")) if p.is_file()))


CARRIED = (".whl", ".devcache", ".devseed")  # what prepare makes, carried to the GPU machine
TRAVEL_LIMIT_MIB = 64  # what the device tool carries in one call: the working tree and the carried folders


TAR_BLOCK = 512  # the device tool counts what travels as a tar packs it: a header, then whole blocks of content
PARKABLE = "docs/results"  # no device stage reads these (prepare packs the runs they need into .devseed/)


def packed_size(size: int) -> int:
    """A file's bytes in a tar: a 512-byte header and its content rounded up to whole 512-byte blocks."""
    return TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK


def parking(folder_sizes: dict[str, int], over: int) -> list[str]:
    """The fewest folders, largest first, whose packed size covers ``over`` bytes ([] when nothing is over);
    all of them when they do not cover it."""
    chosen, freed = [], 0
    for folder, size in sorted(folder_sizes.items(), key=lambda item: (-item[1], item[0])):
        if freed >= over:
            break
        chosen.append(folder)
        freed += size
    return chosen


def park_commands(folders: list[str]) -> str:
    """Leave committed folders out of the working tree for the device calls, and bring them back after: a
    sparse checkout, so nothing is moved by hand and nothing committed can be lost."""
    keep = " ".join(f"'!/{folder}/'" for folder in folders)
    return f"git sparse-checkout set --no-cone '/*' {keep}   (after the device calls: git sparse-checkout disable)"


def travel_size(where: Path) -> str:
    """What a device call would carry, against its limit, counted as a tar packs it: the files git tracks or
    does not ignore in the root (those a sparse checkout leaves out do not travel), and the three carried
    folders; with what to leave behind when it is over."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    names = [f for f in listed.stdout.split("\0") if f] if listed.returncode == 0 else []
    sizes = {name: packed_size((ROOT / name).stat().st_size) for name in names if (ROOT / name).is_file()}
    tree = sum(sizes.values())
    carried = sum(packed_size(p.stat().st_size) for d in CARRIED for p in (where / d).rglob("*") if p.is_file())
    total = tree + carried
    line = (
        f"travel: {total / 2**20:.1f} of {TRAVEL_LIMIT_MIB} MiB as a tar packs it (the working tree "
        f"{tree / 2**20:.1f} in {len(sizes)} files, {', '.join(CARRIED)} {carried / 2**20:.1f})"
    )
    over = total - TRAVEL_LIMIT_MIB * 2**20
    if over > 0:
        folders: dict[str, int] = {}
        for name, size in sizes.items():
            parts = name.split("/")
            if name.startswith(PARKABLE + "/") and len(parts) > 3 and parts[2] != Path(GPU_SUITE_RESULTS).name:
                folder = "/".join(parts[:3])
                folders[folder] = folders.get(folder, 0) + size
        depth_seed = where / ".devseed" / "docs-run-files.tar.gz"
        line += f": OVER the limit by {over / 2**20:.1f} MiB; the device tool would refuse the call. " + (
            "Leave .devseed/docs-run-files.tar.gz behind unless the command is a depth round (the suite stage "
            "reads only .devseed/suite-*), or leave"
            if depth_seed.is_file()
            else "Leave"
        )
        line += " committed results out of the tree: " + park_commands(parking(folders, over))
    return line


def prepare(s: Session, where: Path) -> int:
    """On a networked machine, with the venv's python: what the GPU machine lacks, into ``where``."""
    steps = []
    if s.dry:
        steps.append("wheels and data: skipped in the dry run (they need the network)")
    else:
        pip = [
            s.py,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "-d",
            str(where / ".whl"),
            *WHEELS,
        ]
        subprocess.run(pip, check=True)
        for vocab in ("32768", "8192"):  # the gpu profile's, and the cpu profile's (the depth sweep)
            subprocess.run(
                [
                    s.py,
                    "-m",
                    "resnorm_lm.data",
                    "prepare",
                    "--corpus",
                    "shakespeare",
                    "--vocab-size",
                    vocab,
                    "--cache-dir",
                    str(where / ".devcache"),
                ],
                check=True,
                cwd=ROOT,
            )
        # the raw archive: the prepared splits and the tokenizers are all a run reads (5 MiB of the 64 that travel)
        shutil.rmtree(where / ".devcache" / "downloads", ignore_errors=True)
    sources = sorted(ROOT.glob("docs/results/*/run-files*"))
    runs, notes = run_files.seed_runs(sources, DEPTH_PROFILE, DEPTH_PRECISION)
    tarball = where / ".devseed" / "docs-run-files.tar.gz"
    run_files.write_tarball(tarball, runs)
    for note in notes:
        print(f"prepare: {note}")
    steps.append(
        f"{len(runs)} finished {DEPTH_PROFILE}-profile {DEPTH_PRECISION} runs of {len(sources)} run-files "
        f"folders in {tarball.relative_to(where)} ({tarball.stat().st_size / 2**20:.1f} MiB)"
    )
    for committed in sorted(ROOT.glob(f"{GPU_SUITE_RESULTS}/*/run-files")):  # the suites' GPU runs so far
        name = committed.parent.name
        parts = run_files.pack_runs(committed, where / ".devseed", f"suite-{name}-runs-committed")
        n_runs = len(run_files.finished_runs(committed))
        steps.append(f"{n_runs} committed GPU runs of suite {name} in {', '.join(p.name for p in parts)}")
    for folder in CARRIED:
        path = where / folder
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0
        steps.append(f"{folder}/: {size / 2**20:.1f} MiB")
    steps.append(
        'never commit them; name them in the device tool\'s carry list: [".whl", ".devcache", ".devseed"] '
        "(64 MiB travel in all, the working tree included)"
    )
    steps.append(travel_size(where))
    print("\n".join(f"prepare: {line}" for line in steps))
    return 0


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    after = argv[argv.index("--") + 1 :] if "--" in argv else []  # depth's (compare's) or suite's
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="gpu_session.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stages", nargs="+", choices=["prepare", *DEVICE_STAGES], metavar="STAGE")
    parser.add_argument("--dry-run", action="store_true", help="every stage's plumbing on this CPU, tiny sizes")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or ROOT / "gpu-out"),
        help="where results go (default: $OUT, else ./gpu-out)",
    )
    parser.add_argument("--scratch", type=Path, default=None, help="work folder (default: /tmp/gpu-session)")
    parser.add_argument("--limit-s", type=float, default=570, help="this invocation's time (default 570 s)")
    parser.add_argument("--stage-limit-s", type=float, default=None, help="at most this for any one stage")
    parser.add_argument(
        "--runs-root", type=Path, default=None, help="depth's runs, suites' under suites/ (default: .devruns)"
    )
    parser.add_argument(
        "--seed-dir", type=Path, default=None, help="tarballs of finished runs to start from (default: .devseed)"
    )
    parser.add_argument("--prepare-dir", type=Path, default=None, help="where prepare writes (default: the root)")
    parser.add_argument("--e2e-steps", type=int, default=100, help="optimizer steps of the e2e run (default 100)")
    parser.add_argument("--kernel-widths", type=int, nargs="+", default=KERNEL_WIDTHS)
    args = parser.parse_args(argv)
    if "prepare" in args.stages and len(args.stages) > 1:
        parser.error("prepare runs on a networked machine, the other stages on the GPU: give it alone")
    if len(args.stages) >= device_files.MAX_FILES:  # each stage needs a file of its own, and session.txt one
        parser.error(f"at most {device_files.MAX_FILES - 1} stages in one command: more cannot all come back")
    if len(set(args.stages)) != len(args.stages):
        parser.error("a stage is named twice")
    if {"depth", "suite"} <= set(args.stages):
        parser.error("depth and suite each take the arguments after --: give them in two commands")
    if after and not {"depth", "suite"} & set(args.stages):
        parser.error("arguments after -- are compare's, for the depth stage, or a suite's name, for the suite stage")
    scratch = args.scratch or Path("/tmp/gpu-session")
    args.scratch = scratch
    args.runs_root = args.runs_root or (scratch / "devruns" if args.dry_run else ROOT / ".devruns")
    args.seed_dir = args.seed_dir or (scratch / "devseed" if args.dry_run else ROOT / ".devseed")
    args.prepare_dir = args.prepare_dir or (scratch / "prepared" if args.dry_run else ROOT)
    args.compare_args, args.suite_args = ([], after) if "suite" in args.stages else (after, [])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    s = Session(
        out=args.out,
        scratch=args.scratch,
        dry=args.dry_run,
        runs_root=args.runs_root.resolve(),
        seed_dir=args.seed_dir,
        e2e_steps=args.e2e_steps,
        kernel_widths=args.kernel_widths,
        compare_args=args.compare_args,
        suite_args=args.suite_args,
    )
    if args.stages == ["prepare"]:
        return prepare(s, args.prepare_dir)
    if "depth" in args.stages:
        compare_arguments(s)  # a mistake in them stops here, before any stage runs
    if "suite" in args.stages:
        suite_arguments(s)
    budget = Budget(args.limit_s - PUBLISH_RESERVE_S)
    s.scratch.mkdir(parents=True, exist_ok=True)
    s.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the running child's group goes with the session
    set_up(s)
    for i, name in enumerate(args.stages):
        share = budget.share(WEIGHTS[name], *(WEIGHTS[later] for later in args.stages[i + 1 :]))
        stage_budget = Budget(min(share, args.stage_limit_s or share))
        folder = s.scratch / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        files = [("log.txt", folder / "log.txt")]
        with open(folder / "log.txt", "w") as s.log_file:
            s.say(f"=== {name}: budget {stage_budget.left():.0f} s, {utc_now()}")
            try:
                files = STAGES[name](s, folder, stage_budget)
            except Exception as err:  # a bug in a stage: the others still run, and what it wrote still comes back
                s.record(name, "stage", StepResult(f"failed: {type(err).__name__}: {err}", 0.0))
        s.log_file = None
        s.done.append(device_files.StageFiles(name, files))
        publish(s)
    headlines(s)
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
