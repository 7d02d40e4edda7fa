"""Training-loop benchmark: `resnorm-lm fit` against a bare PyTorch loop, data wait, norms, placements, eval, memory.

    make bench                  # about 6-8 minutes on 2 CPU cores; prints tables, writes benchmarks/results/*.csv
    make bench ARGS="--quick"   # fewer steps and widths (a smoke check)

Every figure is measured here and printed with the machine and versions; nothing is asserted.
The Lightning and bare runs alternate, each in its own process, so the ratio holds on a noisy machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"


# ---------------------------------------------------------------- machine


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import lightning

    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"lightning {lightning.__version__}, python {platform.python_version()}"
    )


# ---------------------------------------------------------------- the two training paths (run as subprocesses)


class StepTimer(L.Callback):
    """Per-step host times and the gap between steps (data wait + loop overhead), written at the end.

    On a GPU the host runs ahead of the device, so single steps are not timed there: the device is
    synchronized only where the timed window opens (before step ``RESNORM_LM_BENCH_WARMUP``) and
    closes (after the last step), which makes the window's tokens/s exact without a sync per step.
    The process's CPU time per step is recorded too: on a CPU shared with other jobs it tells what a
    step costs where the wall time mostly tells the load.
    """

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.cpu_s: list[float] = []  # process CPU seconds per step, all threads

    def on_train_batch_start(self, trainer, *args) -> None:
        if len(self.starts) == int(os.environ.get("RESNORM_LM_BENCH_WARMUP", "0")):
            sync(trainer.strategy.root_device)
        self.starts.append(time.perf_counter())
        self.cpu_start = time.process_time()

    def on_train_batch_end(self, trainer, *args) -> None:
        if len(self.ends) + 1 == trainer.max_steps:
            sync(trainer.strategy.root_device)
        self.ends.append(time.perf_counter())
        self.cpu_s.append(time.process_time() - self.cpu_start)

    def on_train_end(self, trainer, pl_module) -> None:
        Path(os.environ["RESNORM_LM_BENCH_OUT"]).write_text(
            json.dumps({"starts": self.starts, "ends": self.ends, "cpu_s": self.cpu_s})
        )


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# the model each bench profile times: the profile's own prenorm-12l; on a GPU, GPT-2 small on Shakespeare (offline);
# smoke: a tiny model, to check the plumbing (benchmarks/gpu_session.py --dry-run)
BENCH_PROFILES = {
    "cpu": {"fit": ["--profile", "cpu"], "data": {}, "warmup": 8, "steps": 40, "quick": (4, 12)},
    "gpu": {
        "fit": [
            "--profile",
            "gpu",
            "--data.corpus=shakespeare",
            "--trainer.accumulate_grad_batches=1",
            "--trainer.num_sanity_val_steps=0",
        ],
        "data": {"corpus": "shakespeare"},
        "warmup": 15,
        "steps": 45,
        "quick": (5, 15),
    },
    "smoke": {"fit": ["--profile", "smoke"], "data": {}, "warmup": 2, "steps": 6, "quick": (1, 3)},
}


def data_overrides(data_files: list[str] | None) -> tuple[list[str], dict]:
    """``--data-files``: local text files in place of the profile's corpus, as `fit` options and as data settings."""
    if not data_files:
        return [], {}
    return ["--data.corpus=text", f"--data.files=[{','.join(data_files)}]"], {"corpus": "text", "files": data_files}


def lightning_child(
    profile: str, compile_: bool, steps: int, warmup: int, out: str, data_files: list[str] | None = None
) -> None:
    """`resnorm-lm fit` on the profile's prenorm-12l, with every callback a user run has."""
    from resnorm_lm.cli import main

    os.environ["RESNORM_LM_BENCH_OUT"] = out
    os.environ["RESNORM_LM_BENCH_WARMUP"] = str(warmup)
    with tempfile.TemporaryDirectory() as root:
        code = main(
            [
                "fit",
                "--recipe",
                "prenorm-12l",
                *BENCH_PROFILES[profile]["fit"],
                *data_overrides(data_files)[0],
                f"--run.root={root}",
                f"--model.compile={str(compile_).lower()}",
                f"--trainer.max_steps={steps}",
                f"--trainer.val_check_interval={steps * 10}",
                "--run.sample_tokens=0",
                "--trainer.enable_progress_bar=false",
                "--trainer.callbacks+=benchmarks.bench_training.StepTimer",
            ]
        )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    data = json.loads(Path(out).read_text())
    data["max_rss_mb"] = usage.ru_maxrss / 1024
    data["exit"] = code
    Path(out).write_text(json.dumps(data))


def bench_config(profile: str, data_files: list[str] | None = None) -> tuple[dict, dict, dict]:
    """The profile's config, and the data and architecture settings of its prenorm-12l as the bench runs it."""
    import yaml

    config = yaml.safe_load((ROOT / f"recipes/profiles/{profile}.yaml").read_text())
    recipe = yaml.safe_load((ROOT / "recipes/prenorm-12l.yaml").read_text())
    data_cfg = {**config["data"], **BENCH_PROFILES[profile]["data"], **data_overrides(data_files)[1]}
    return config, data_cfg, {**config["model"]["arch"], **recipe["model"]["arch"]}


def bare_child(
    profile: str, compile_: bool, steps: int, warmup: int, out: str, data_files: list[str] | None = None
) -> None:
    """The same model, data, precision, optimizer, schedule and clipping as plainly as possible."""
    import torch

    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.model.gpt import GPT, GPTConfig
    from resnorm_lm.train.cpu_attention import use_for_run
    from resnorm_lm.train.optim import OptimConfig, build_optimizer
    from resnorm_lm.train.precision import choose_auto, set_matmul_precision_for

    config, data_cfg, arch = bench_config(profile, data_files)
    device = torch.device("cuda" if profile == "gpu" else "cpu")
    set_matmul_precision_for(device.type == "cuda")
    autocast = choose_auto(device.type == "cuda").precision == "bf16-mixed"  # what `precision: auto` picks in fit
    if device.type == "cpu":  # the attention kernel fit measures and uses for this dtype
        use_for_run(
            "bf16-mixed" if autocast else "32-true",
            data_cfg["batch_size"],
            arch["n_head"],
            data_cfg["block_size"],
            arch["n_embd"],
        )
    torch.manual_seed(config["seed_everything"])
    dm = TextDataModule(**data_cfg)
    dm.prepare_data()
    dm.setup()
    model = GPT(GPTConfig(**arch, vocab_size=data_cfg["vocab_size"], block_size=data_cfg["block_size"])).to(device)
    optimizer, schedule = build_optimizer(model, OptimConfig(**config["model"]["optim"]), steps)  # fused on CUDA
    if compile_:
        model.compile()
    starts, ends = [], []
    batches = iter(dm.train_dataloader())
    model.train()
    for step in range(steps):
        if step == warmup:
            sync(device)
        starts.append(time.perf_counter())
        x, y = (t.to(device, non_blocking=True) for t in next(batches))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step == steps - 1:
            sync(device)
        ends.append(time.perf_counter())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    per_token = model.flops_per_token(data_cfg["block_size"])
    Path(out).write_text(
        json.dumps(
            {
                "starts": starts,
                "ends": ends,
                "max_rss_mb": usage.ru_maxrss / 1024,
                "flops_per_token": per_token,
                "precision": "bf16-mixed" if autocast else "32-true",
            }
        )
    )


class ChildFailed(Exception):
    """A timed child that exited with an error, or ran out of the time it was given: its row says so."""


def run_child(
    kind: str,
    profile: str,
    compile_: bool,
    steps: int,
    warmup: int,
    timeout_s: float | None = None,
    data_files: list[str] | None = None,
) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--profile",
        profile,
        f"--child-compile={int(compile_)}",
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--out",
        out,
        *(["--data-files", *data_files] if data_files else []),
    ]
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"bench child {kind} (compile={compile_}) ran past its {timeout_s:.0f} s") from None
    try:
        if done.returncode != 0:
            raise ChildFailed(f"bench child {kind} (compile={compile_}) failed:\n{done.stderr[-4000:]}")
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def steady_rate(data: dict, warmup: int, tokens_per_step: int) -> dict:
    """Tokens/s from the first timed step after warmup to the last step's end (gaps included)."""
    starts, ends = data["starts"][warmup:], data["ends"][warmup:]
    wall = ends[-1] - starts[0]
    compute = sum(e - s for s, e in zip(starts, ends))
    gaps = [s - e for e, s in zip(ends, starts[1:])]
    return {
        "tokens_per_s": tokens_per_step * len(starts) / wall,
        "step_s": wall / len(starts),
        "gap_fraction": sum(gaps) / wall,
        "compute_s": compute / len(starts),
        "max_rss_mb": data.get("max_rss_mb"),
    }


# ---------------------------------------------------------------- norms, placements, eval, data


def time_it(fn, repeat: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_norms(widths: list[int], rows: int, repeat: int) -> list[dict]:
    import torch
    import torch._dynamo

    from resnorm_lm.model.norms import build_norm

    torch._dynamo.config.recompile_limit = 64  # one compile per (norm, width): never fall back to eager
    out = []
    for name in NORM_NAMES:
        for mode in ("norm", "add+norm"):
            for compiled in (False, True):
                norm_module = build_norm(name, max(widths))

                def step(x, d, norm):
                    y = norm.add_norm(x, d).normed if d is not None else norm(x)
                    y.sum().backward()

                fn = torch.compile(step, dynamic=False) if compiled else step
                for n in widths:
                    norm = build_norm(name, n)
                    x = torch.randn(rows, n, requires_grad=True)
                    d = torch.randn(rows, n, requires_grad=True) if mode == "add+norm" else None
                    t = time_it(lambda: fn(x, d, norm), repeat)
                    out.append(
                        {
                            "norm": name,
                            "mode": mode,
                            "impl": "compile" if compiled else "eager",
                            "width": n,
                            "rows": rows,
                            "fwd_bwd_ms": round(t * 1e3, 3),
                        }
                    )
                del norm_module
    return out


def bench_steps(
    steps: int, device, variants: list[dict], shape: dict, relative_to: dict, deadline: float | None = None
) -> list[dict]:
    """Step time (fwd + bwd + AdamW, precision as `auto` picks) of the profile's 12-block model, for each variant
    (GPTConfig overrides plus ``compile``), timed side by side: one step of each in turn, ``steps`` rounds after
    one untimed round, the median per variant. ``ratio`` is against the variant matching ``relative_to`` in
    the keys it names and sharing the variant's other keys. Fewer rounds (at least two) once ``deadline``
    (``time.monotonic()``) has passed. A variant whose step raises is left out of the timing: its row holds
    the error, no time."""
    import torch

    from resnorm_lm.model.gpt import GPT, GPTConfig
    from resnorm_lm.train.cpu_attention import use_for_run
    from resnorm_lm.train.precision import choose_auto

    torch._dynamo.config.recompile_limit = 64
    autocast = choose_auto(device.type == "cuda").precision == "bf16-mixed"  # as `precision: auto` in fit
    if device.type == "cpu":
        use_for_run(
            "bf16-mixed" if autocast else "32-true", shape["batch"], shape["heads"], shape["block"], shape["width"]
        )
    x = torch.randint(0, shape["vocab"], (shape["batch"], shape["block"]), device=device)  # (B, T)
    y = torch.randint(0, shape["vocab"], (shape["batch"], shape["block"]), device=device)  # (B, T)

    def make_step(variant: dict):
        torch.manual_seed(0)
        arch = {k: v for k, v in variant.items() if k != "compile"}
        model = GPT(
            GPTConfig(
                vocab_size=shape["vocab"],
                block_size=shape["block"],
                n_layer=12,
                n_head=shape["heads"],
                n_embd=shape["width"],
                **arch,
            )
        ).to(device)
        if variant["compile"]:
            model.compile()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(device)

        return step

    steppers = [make_step(v) for v in variants]
    times: list[list[float]] = [[] for _ in variants]
    errors: list[str | None] = [None for _ in variants]
    for round_ in range(steps + 1):
        if deadline is not None and round_ > 2 and time.monotonic() > deadline:
            print(f"  (time budget: {round_ - 1} timed rounds of {steps})", flush=True)
            break
        for i, (fn, t) in enumerate(zip(steppers, times)):
            if errors[i]:
                continue
            t0 = time.perf_counter()
            try:
                fn()
            except Exception as err:  # one variant failing (a kernel, a compile) leaves the others' times
                errors[i] = f"{type(err).__name__}: {err}"[:300]
                print(f"  {variants[i]}: failed: {errors[i]}", flush=True)
                continue
            if round_:  # the first round compiles and warms up
                t.append(time.perf_counter() - t0)
    out = [{**v, "step_s": statistics.median(t) if t else None, "error": e} for v, t, e in zip(variants, times, errors)]
    for r in out:
        base = next(b["step_s"] for b in out if all(b[k] == (relative_to.get(k, r[k])) for k in variants[0]))
        r["ratio"] = round(r["step_s"] / base, 3) if r["step_s"] and base else None
        r["step_s"] = round(r["step_s"], 4) if r["step_s"] is not None else None
    return out


def bench_eval_and_tokenizer() -> dict:
    import torch

    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.model.gpt import GPT, GPTConfig

    dm = TextDataModule(vocab_size=8192, block_size=128, batch_size=16, eval_batch_size=32)
    dm.prepare_data()
    dm.setup()
    tokenizer = dm.prepared.tokenizer
    docs = [tokenizer.decode(list(map(int, dm.prepared.tokens("validation")[:200_000])))]
    t0 = time.perf_counter()
    n = sum(len(e.ids) for e in tokenizer.encode_batch(docs))
    tok_rate = n / (time.perf_counter() - t0)
    model = GPT(GPTConfig(vocab_size=8192, block_size=128, n_layer=12, n_head=4, n_embd=128)).eval()
    windows = dm.eval_windows("validation")
    loader = torch.utils.data.DataLoader(windows, batch_size=32)
    t0, tokens = time.perf_counter(), 0
    from resnorm_lm.train.precision import choose_auto

    autocast = choose_auto(False).precision == "bf16-mixed"  # as `precision: auto` evaluates on this CPU
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        for i, (x, _) in enumerate(loader):
            model(x)
            tokens += x.numel()
            if i == 40:
                break
    return {"tokenize_tokens_per_s": round(tok_rate), "eval_tokens_per_s": round(tokens / (time.perf_counter() - t0))}


def anatomy_row(r: dict) -> dict:
    """One configuration of the step's anatomy as a flat CSV row (ms per step by kind)."""
    from benchmarks.step_anatomy import KINDS, OTHER

    flat = {k: r[k] for k in ("precision", "compile", "plain")}
    flat.update(step_ms=round(r["step_ms"], 1), compile_s=round(r["compile_s"], 1))
    flat.update({f"ms {kind}": round(r["by_kind"].get(kind, 0.0), 2) for kind in [k for k, _ in KINDS] + [OTHER]})
    return flat


def write_csv(name: str, rows: list[dict], folder: Path = RESULTS) -> None:
    if not rows:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def peak_flops() -> float | None:
    """The GPU's dense bf16 peak (Lightning's table), for MFU; None off CUDA or where the table has no entry."""
    import torch
    from lightning.fabric.utilities.throughput import get_available_flops

    if not torch.cuda.is_available():
        return None
    return get_available_flops(torch.device("cuda"), torch.bfloat16)


def no_peak_reason() -> str:
    """Why MFU is left out: no GPU, or a GPU (an H200 named plainly "NVIDIA H200", say) Lightning has no peak for."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA"
    return f"Lightning's table has no dense bf16 peak for {torch.cuda.get_device_name()!r}"


def bench_throughput(
    profile: str,
    compiles: list[bool],
    rounds: int,
    steps: int,
    warmup: int,
    deadline: float | None = None,
    data_files: list[str] | None = None,
) -> list[dict]:
    """Lightning's `fit` against the bare loop, alternating, each in its own process; medians over rounds.

    A child that fails or outlasts ``deadline`` (``time.monotonic()``) is reported and left out; a path with
    no run left has a row with its error and no figures."""
    peak = peak_flops() if profile == "gpu" else None
    _, data_cfg, _ = bench_config(profile, data_files)
    tokens_per_step = data_cfg["batch_size"] * data_cfg["block_size"]
    rows = []
    for compiled in compiles:
        rates: dict[str, list[dict]] = {"lightning": [], "bare": []}
        errors: dict[str, str] = {}
        per_token = None  # the bare child counts the model's parameters
        for _ in range(rounds):
            for kind, runs in rates.items():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left < 10:
                    errors.setdefault(kind, "skipped: out of time")
                    continue
                try:
                    data = run_child(kind, profile, compiled, steps, warmup, left, data_files)
                except ChildFailed as err:
                    errors[kind] = str(err).splitlines()[0]
                    print(f"  {kind} (compile={str(compiled).lower()}): {err}", flush=True)
                    continue
                per_token = data.get("flops_per_token", per_token)
                runs.append(steady_rate(data, warmup, tokens_per_step))
                # as each child ends: a long benchmark cut short still says something
                print(
                    f"  {kind} (compile={str(compiled).lower()}): {runs[-1]['tokens_per_s']:.0f} tokens/s", flush=True
                )
        paired = [  # each round's Lightning run over its bare run: the two ran back to back, on one machine state
            light["tokens_per_s"] / bare["tokens_per_s"]
            for light, bare in zip(rates["lightning"], rates["bare"], strict=False)
        ]
        for kind, runs in rates.items():
            row = {
                "path": kind,
                "compile": compiled,
                "tokens_per_s": None,
                "step_s": None,
                "gap_fraction": None,
                "mfu": None,
                "max_rss_mb": None,
                "runs": len(runs),
                "error": errors.get(kind),
                "paired_ratios": ";".join(f"{r:.3f}" for r in paired),
            }
            if runs:
                tps = statistics.median(r["tokens_per_s"] for r in runs)
                row.update(
                    tokens_per_s=round(tps),
                    step_s=round(statistics.median(r["step_s"] for r in runs), 4),
                    gap_fraction=round(statistics.median(r["gap_fraction"] for r in runs), 4),
                    mfu=round(tps * per_token / peak, 3) if peak and per_token else None,
                    max_rss_mb=round(max(r["max_rss_mb"] for r in runs)),
                )
            rows.append(row)
    return rows


def cell(value, spec: str, width: int) -> str:
    """``value`` formatted by ``spec``, or "n/a" where it was not measured, right-aligned in ``width``."""
    return f"{value:{width}{spec}}" if value is not None else f"{'n/a':>{width}}"


def print_throughput(
    rows: list[dict], profile: str, rounds: int, steps: int, warmup: int, mfu_missing: str = ""
) -> None:
    print(
        f"training throughput, {profile} profile prenorm-12l ({PROFILE_SHAPES[profile]}), "
        f"steps {warmup}..{steps} of {rounds} alternating run(s) each, medians:"
    )
    gpu = profile == "gpu"
    print(
        f"{'path':10} {'compile':8} {'tokens/s':>9} {'s/step':>8} "
        + (f"{'MFU':>6}" if gpu else f"{'between steps':>14} {'peak RSS MB':>12}")
    )
    for r in rows:
        tail = (
            cell(r["mfu"], ".3f", 6)
            if gpu
            else f"{cell(r['gap_fraction'], '.2%', 13)} {cell(r['max_rss_mb'], 'd', 12)}"
        )
        error = f"  ({r['error']})" if r.get("error") else ""
        print(
            f"{r['path']:10} {str(r['compile']).lower():8} {cell(r['tokens_per_s'], 'd', 9)} "
            f"{cell(r['step_s'], '.4f', 8)} {tail}{error}"
        )
    for compiled in sorted({r["compile"] for r in rows}):
        paired = [float(r) for r in next(r for r in rows if r["compile"] == compiled)["paired_ratios"].split(";") if r]
        ratio = f"{statistics.median(paired):.3f}" if paired else "n/a"
        spread = f" (median of {len(paired)} rounds' ratios, {min(paired):.3f}..{max(paired):.3f})" if paired else ""
        print(
            f"lightning_vs_bare_ratio (compile={str(compiled).lower()})={ratio}"
            + (spread if paired else " (a path has no run: see its row)")
        )
    if gpu and any(r["tokens_per_s"] and r["mfu"] is None for r in rows):
        print(f"MFU: left out: {mfu_missing or 'the FLOPs per token are unknown (the bare child did not finish)'}")
    if gpu:
        print(
            "(MFU: (6N + 12 L C T) FLOPs per token x tokens/s / the GPU's dense bf16 peak; the device is "
            "synchronized only where the timed window opens and closes)\n"
        )
    else:
        print(
            "('between steps' is the time from one step's end to the next step's start: data loading plus loop "
            "overhead)\n"
        )


PROFILE_SHAPES = {
    "cpu": "12 x 128 wide, context 128, batch 16, precision as `auto` picks",
    "gpu": "GPT-2 small: 12 x 768 wide, vocab 32768, context 1024, batch 32, bf16-mixed, Shakespeare",
    "smoke": "a plumbing check: 12 x 32 wide, context 32, batch 4, fp32",
}
NORM_NAMES = ("layernorm", "rmsnorm", "scalenorm", "dyt")  # the norm table's rows (dyt_llm computes as dyt)
PLACEMENT_SHAPES = {
    "cpu": {"vocab": 8192, "block": 128, "heads": 4, "width": 128, "batch": 16},
    "gpu": {"vocab": 32768, "block": 1024, "heads": 12, "width": 768, "batch": 32},
    "smoke": {"vocab": 512, "block": 32, "heads": 2, "width": 32, "batch": 4},
}


def print_step_rows(rows: list[dict], columns: tuple[tuple[str, int], ...]) -> None:
    """One line per ``bench_steps`` row: the named columns at their widths, compile, the step time, the ratio."""
    for r in rows:
        named = " ".join(f"{r[key]:{width}}" for key, width in columns)
        timed = f"{r['step_s']:.4f} s" if r["step_s"] is not None else f"failed: {r['error']}"
        ratio = f"  x{r['ratio']:.2f}" if r["ratio"] is not None else ""
        print(f"  {named} compile={str(r['compile']).lower():5} {timed}{ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps, rounds and widths")
    parser.add_argument(
        "--profile",
        choices=["auto", "cpu", "gpu", "smoke"],
        default="auto",
        help="the model and data timed (auto: gpu where CUDA is available; smoke: a tiny model, to check the plumbing)",
    )
    parser.add_argument(
        "--compile",
        choices=["off", "on", "both"],
        default=None,
        help="torch.compile in the throughput and placement tables (default: off on cpu, both on gpu)",
    )
    parser.add_argument(
        "--placements",
        nargs="+",
        default=None,
        help="placements timed (default: all on cpu, prenorm and postnorm on gpu)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        choices=["anatomy", "throughput", "placements", "norm-steps", "eval", "norms"],
        help="run only these sections",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="alternating runs of each path; the ratio is the median of each round's (default: 5 on cpu, 1 on "
        "gpu or with --quick)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the CSVs go (default: %(default)s)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall time to keep to: children past it are stopped and reported, rounds cut short",
    )
    parser.add_argument(
        "--data-files",
        nargs="+",
        default=None,
        help="local text files (paths or globs) in place of the profile's corpus",
    )
    parser.add_argument("--child", choices=["lightning", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--child-compile", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    profile = args.profile if args.profile != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
    if args.child:
        child = lightning_child if args.child == "lightning" else bare_child
        child(profile, bool(args.child_compile), args.steps, args.warmup, args.out, args.data_files)
        return 0
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    if profile == "gpu" and not torch.cuda.is_available():
        print("bench: --profile gpu needs a CUDA GPU; none here", file=sys.stderr)
        return 2
    compile_choice = args.compile or ("both" if profile == "gpu" else "off")
    compiles = {"off": [False], "on": [True], "both": [False, True]}[compile_choice]
    sections = args.only or ["anatomy", "throughput", "placements", "norm-steps", "eval", "norms"]
    bp = BENCH_PROFILES[profile]
    warmup, steps = bp["quick"] if args.quick else (bp["warmup"], bp["steps"])
    # the ratio is a median over rounds: five on the CPU, where a shared machine's speed drifts within minutes
    rounds = args.rounds or (5 if profile == "cpu" and not args.quick else 1)
    widths = [128, 1024] if args.quick else [128, 256, 512, 1024, 2048, 4096]
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}\n")
    written = []

    if "anatomy" in sections and profile == "cpu":
        from benchmarks.step_anatomy import run as step_anatomy

        anatomy = step_anatomy(quick=args.quick)
        write_csv("step_anatomy_cpu.csv", [anatomy_row(r) for r in anatomy], args.results)
        written.append("step_anatomy_cpu.csv")
        print()

    if "throughput" in sections:
        rows = bench_throughput(profile, compiles, rounds, steps, warmup, deadline, args.data_files)
        print_throughput(rows, profile, rounds, steps, warmup, no_peak_reason() if profile == "gpu" else "")
        write_csv(f"training_{profile}.csv", rows, args.results)
        written.append(f"training_{profile}.csv")

    if "eval" in sections and profile == "cpu":
        extra = bench_eval_and_tokenizer()
        print(
            f"evaluation: {extra['eval_tokens_per_s']} tokens/s (batch 32 x 128); "
            f"tokenization: {extra['tokenize_tokens_per_s']} tokens/s (encode_batch)\n"
        )

    if "placements" in sections:
        from resnorm_lm.model.placements import PLACEMENTS

        device = torch.device("cuda" if profile == "gpu" else "cpu")
        names = args.placements or (["prenorm", "postnorm"] if profile == "gpu" else PLACEMENTS.names())
        if profile != "gpu":
            print("step time by placement: the triton backend is timed on a GPU only (no CUDA here)")
        backends = ["torch", "triton"] if profile == "gpu" else ["torch"]
        variants = [
            {"placement": p, "norm_backend": b, "compile": c} for p in names for b in backends for c in compiles
        ]
        placements = bench_steps(
            3 if args.quick else 5,
            device,
            variants,
            PLACEMENT_SHAPES[profile],
            relative_to={"placement": "prenorm"},
            deadline=deadline,
        )
        print(
            f"step time by placement ({profile}-profile model, precision as `auto` picks, fwd+bwd+AdamW), "
            "relative to prenorm with the same backend and compile setting:"
        )
        print_step_rows(placements, (("placement", 11), ("norm_backend", 7)))
        write_csv(f"placements_{profile}.csv", placements, args.results)
        written.append(f"placements_{profile}.csv")

    if "norm-steps" in sections:
        device = torch.device("cuda" if profile == "gpu" else "cpu")
        pairs = [("prenorm", n) for n in ("layernorm", "rmsnorm", "scalenorm", "dyt", "dyt_llm")]
        pairs += [("postnorm", "layernorm"), ("postnorm", "rmsnorm")]
        variants = [{"placement": p, "norm": n, "compile": c} for p, n in pairs for c in compiles]
        rows = bench_steps(
            5 if args.quick else 20,
            device,
            variants,
            PLACEMENT_SHAPES[profile],
            relative_to={"norm": "layernorm"},
            deadline=deadline,
        )
        print(
            f"step time by norm ({profile}-profile model, precision as `auto` picks, fwd+bwd+AdamW, timed in "
            "turn), relative to LayerNorm in the same placement and compile setting:"
        )
        print_step_rows(rows, (("placement", 9), ("norm", 10)))
        write_csv(f"norm_steps_{profile}.csv", rows, args.results)
        written.append(f"norm_steps_{profile}.csv")
        print()

    if "norms" in sections and profile == "cpu":  # on a GPU: make bench-kernels
        norms = bench_norms(widths, 4096 if not args.quick else 1024, 5 if args.quick else 10)
        print(f"\nnorms, forward+backward of {norms[0]['rows']} rows (ms), eager / torch.compile:")
        print(f"{'norm':10} {'mode':9} " + " ".join(f"{w:>13}" for w in widths))
        for name in NORM_NAMES:
            for mode in ("norm", "add+norm"):
                cells = []
                for w in widths:
                    key = {(r["norm"], r["mode"], r["impl"], r["width"]): r for r in norms}
                    e, c = key[(name, mode, "eager", w)], key[(name, mode, "compile", w)]
                    cells.append(f"{e['fwd_bwd_ms']:6.2f}/{c['fwd_bwd_ms']:6.2f}")
                print(f"{name:10} {mode:9} " + " ".join(f"{c:>13}" for c in cells))
        write_csv("norms.csv", norms, args.results)
        written.append("norms.csv")
    if written:
        print(f"\nwrote {', '.join(str(args.results / w) for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
