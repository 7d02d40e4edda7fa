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

    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"lightning {lightning.__version__}, python {platform.python_version()}")  # fmt: skip


# ---------------------------------------------------------------- the two training paths (run as subprocesses)


class StepTimer(L.Callback):
    """Per-step compute time and the gap between steps (data wait + loop overhead), written at the end."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def on_train_batch_start(self, trainer, *args) -> None:
        self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, *args) -> None:
        self.ends.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        Path(os.environ["RESNORM_LM_BENCH_OUT"]).write_text(json.dumps({"starts": self.starts, "ends": self.ends}))


def lightning_child(steps: int, out: str) -> None:
    """`resnorm-lm fit` on the cpu profile's prenorm-12l, with every callback a user run has."""
    from resnorm_lm.cli import main

    os.environ["RESNORM_LM_BENCH_OUT"] = out
    with tempfile.TemporaryDirectory() as root:
        code = main(["fit", "--recipe", "prenorm-12l", "--profile", "cpu", f"--run.root={root}",
                     f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps * 10}",
                     "--run.sample_tokens=0", "--trainer.enable_progress_bar=true",
                     "--trainer.callbacks+=benchmarks.bench_training.StepTimer"])  # fmt: skip
    usage = resource.getrusage(resource.RUSAGE_SELF)
    data = json.loads(Path(out).read_text())
    data["max_rss_mb"] = usage.ru_maxrss / 1024
    data["exit"] = code
    Path(out).write_text(json.dumps(data))


def bare_child(steps: int, out: str) -> None:
    """The same model, data, precision, optimizer, schedule and clipping as plainly as possible."""
    import torch
    import yaml

    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.model import GPT, GPTConfig
    from resnorm_lm.optim import OptimConfig, build_optimizer

    profile = yaml.safe_load((ROOT / "recipes/profiles/cpu.yaml").read_text())
    recipe = yaml.safe_load((ROOT / "recipes/prenorm-12l.yaml").read_text())
    data_cfg = profile["data"]
    arch = {**profile["model"]["arch"], **recipe["model"]["arch"]}
    torch.manual_seed(profile["seed_everything"])
    dm = TextDataModule(**data_cfg)
    dm.prepare_data()
    dm.setup()
    model = GPT(GPTConfig(**arch, vocab_size=data_cfg["vocab_size"], block_size=data_cfg["block_size"]))
    optimizer, schedule = build_optimizer(model, OptimConfig(**profile["model"]["optim"]), steps)
    starts, ends = [], []
    batches = iter(dm.train_dataloader())
    model.train()
    for _ in range(steps):
        starts.append(time.perf_counter())
        x, y = next(batches)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        ends.append(time.perf_counter())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(json.dumps({"starts": starts, "ends": ends, "max_rss_mb": usage.ru_maxrss / 1024}))


def run_child(kind: str, steps: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, __file__, "--child", kind, "--steps", str(steps), "--out", out]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data = json.loads(Path(out).read_text())
    os.unlink(out)
    return data


def steady_rate(data: dict, warmup: int, tokens_per_step: int) -> dict:
    """Tokens/s from the first timed step after warmup to the last step's end (gaps included)."""
    starts, ends = data["starts"][warmup:], data["ends"][warmup:]
    wall = ends[-1] - starts[0]
    compute = sum(e - s for s, e in zip(starts, ends))
    gaps = [s - e for e, s in zip(ends, starts[1:])]
    return {"tokens_per_s": tokens_per_step * len(starts) / wall, "step_s": wall / len(starts),
            "gap_fraction": sum(gaps) / wall, "compute_s": compute / len(starts),
            "max_rss_mb": data.get("max_rss_mb")}  # fmt: skip


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

    from resnorm_lm.norms import build_norm

    torch._dynamo.config.recompile_limit = 64  # one compile per (norm, width): never fall back to eager
    out = []
    for name in ("layernorm", "rmsnorm", "scalenorm", "dyt"):
        for mode in ("norm", "add+norm"):
            for compiled in (False, True):
                norm_module = build_norm(name, max(widths))

                def step(x, d, norm):
                    y = norm.add_norm(x, d)[0] if d is not None else norm(x)
                    y.sum().backward()

                fn = torch.compile(step, dynamic=False) if compiled else step
                for n in widths:
                    norm = build_norm(name, n)
                    x = torch.randn(rows, n, requires_grad=True)
                    d = torch.randn(rows, n, requires_grad=True) if mode == "add+norm" else None
                    t = time_it(lambda: fn(x, d, norm), repeat)
                    out.append({"norm": name, "mode": mode, "impl": "compile" if compiled else "eager", "width": n,
                                "rows": rows, "fwd_bwd_ms": round(t * 1e3, 3)})  # fmt: skip
                del norm_module
    return out


def bench_placements(steps: int) -> list[dict]:
    import torch

    from resnorm_lm.model import GPT, GPTConfig
    from resnorm_lm.placements import PLACEMENTS

    out = []
    for placement in PLACEMENTS.names():
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=8192, block_size=128, n_layer=12, n_head=4, n_embd=128, placement=placement))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = torch.randint(0, 8192, (16, 128)), torch.randint(0, 8192, (16, 128))

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        out.append({"placement": placement, "step_s": time_it(step, steps)})
    base = next(r["step_s"] for r in out if r["placement"] == "prenorm")
    for r in out:
        r["vs_prenorm"] = round(r["step_s"] / base, 3)
        r["step_s"] = round(r["step_s"], 4)
    return out


def bench_eval_and_tokenizer() -> dict:
    import torch

    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.model import GPT, GPTConfig

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
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for i, (x, _) in enumerate(loader):
            model(x)
            tokens += x.numel()
            if i == 40:
                break
    return {"tokenize_tokens_per_s": round(tok_rate), "eval_tokens_per_s": round(tokens / (time.perf_counter() - t0))}


def write_csv(name: str, rows: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / name, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps, rounds and widths")
    parser.add_argument("--child", choices=["lightning", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        (lightning_child if args.child == "lightning" else bare_child)(args.steps, args.out)
        return 0
    steps, rounds, warmup = (12, 1, 4) if args.quick else (40, 2, 8)
    widths = [128, 1024] if args.quick else [128, 256, 512, 1024, 2048, 4096]
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}\n")

    tokens_per_step = 16 * 128
    results = {"lightning": [], "bare": []}
    for _ in range(rounds):
        for kind in ("lightning", "bare"):
            results[kind].append(steady_rate(run_child(kind, steps), warmup, tokens_per_step))
    rows = []
    for kind, runs in results.items():
        rows.append({"path": kind, "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in runs)),
                     "step_s": round(statistics.median(r["step_s"] for r in runs), 4),
                     "gap_fraction": round(statistics.median(r["gap_fraction"] for r in runs), 4),
                     "max_rss_mb": round(max(r["max_rss_mb"] for r in runs))})  # fmt: skip
    ratio = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    print("training throughput, cpu profile prenorm-12l (12 x 128 wide, context 128, batch 16, bf16-mixed),")
    print(f"steps {warmup}..{steps} of {rounds} alternating runs each, medians:")
    print(f"{'path':10} {'tokens/s':>9} {'s/step':>8} {'between steps':>14} {'peak RSS MB':>12}")
    for r in rows:
        print(
            f"{r['path']:10} {r['tokens_per_s']:9d} {r['step_s']:8.4f} {r['gap_fraction']:13.2%} {r['max_rss_mb']:12d}"
        )
    print(f"lightning_vs_bare_ratio={ratio:.3f}")
    print(
        "('between steps' is the time from one step's end to the next step's start: data loading plus loop overhead)\n"
    )
    write_csv("training.csv", rows)

    extra = bench_eval_and_tokenizer()
    print(f"evaluation: {extra['eval_tokens_per_s']} tokens/s (bf16, batch 32 x 128); "
          f"tokenization: {extra['tokenize_tokens_per_s']} tokens/s (encode_batch)\n")  # fmt: skip

    placements = bench_placements(3 if args.quick else 5)
    print("step time by placement (cpu-profile model, bf16 autocast, fwd+bwd+AdamW), relative to prenorm:")
    for r in placements:
        print(f"  {r['placement']:11} {r['step_s']:.3f} s  x{r['vs_prenorm']:.2f}")
    write_csv("placements.csv", placements)

    norms = bench_norms(widths, 4096 if not args.quick else 1024, 5 if args.quick else 10)
    print(f"\nnorms, forward+backward of {norms[0]['rows']} rows (ms), eager / torch.compile:")
    print(f"{'norm':10} {'mode':9} " + " ".join(f"{w:>13}" for w in widths))
    for name in ("layernorm", "rmsnorm", "scalenorm", "dyt"):
        for mode in ("norm", "add+norm"):
            cells = []
            for w in widths:
                e = next(r for r in norms if (r["norm"], r["mode"], r["impl"], r["width"]) == (name, mode, "eager", w))
                c = next(
                    r for r in norms if (r["norm"], r["mode"], r["impl"], r["width"]) == (name, mode, "compile", w)
                )
                cells.append(f"{e['fwd_bwd_ms']:6.2f}/{c['fwd_bwd_ms']:6.2f}")
            print(f"{name:10} {mode:9} " + " ".join(f"{c:>13}" for c in cells))
    write_csv("norms.csv", norms)
    print(f"\nwrote {RESULTS}/training.csv, placements.csv, norms.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
