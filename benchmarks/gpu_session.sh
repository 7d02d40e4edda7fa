#!/usr/bin/env bash
# Issue 21's GPU measurements, in stages that each fit one 10-minute command on the offline GPU machine
# (torch 2.11, triton 3.6 preinstalled, no network; the missing wheels and the data cache are carried along).
#
#   bash benchmarks/gpu_session.sh prepare              # once, on a networked machine: wheels + Shakespeare cache
#   bash benchmarks/gpu_session.sh check kernels        # GPU command 1: GPU tests, the kernel table
#   bash benchmarks/gpu_session.sh training e2e         # GPU command 2: Lightning vs bare and MFU; make-train run
#   bash benchmarks/gpu_session.sh placements profile   # GPU command 3: step time by backend; profiler trace
#
# prepare leaves .whl/ and .devcache/ in the project root (never committed; partly git-ignored): name both
# in the device tool's carry list. Each stage writes under $OUT/<stage>/ (OUT: the device tool's output
# folder, ./gpu-out otherwise), its whole output in <stage>/log.txt. One invocation stops its stages by
# RUN_LIMIT_S (default 570 s: a device command may run 600 s); a stage is also stopped after STAGE_LIMIT_S
# (default: all that is left). A stopped stage keeps what it wrote so far, and the next stage starts.
#
# The stages:
#   check     GPU tests: triton_op launched by Inductor with dynamic shapes, opcheck, autotuned parity and
#             determinism at 768-8192 (tests/test_triton_gpu.py)
#   kernels   benchmarks/bench_kernels.py, bf16, widths 768-8192: GPU time (CUDA-graph replay) and eager wall
#             time per call apart, against torch eager and torch.compile and copy bandwidth; host time per call
#   training  benchmarks/bench_training.py --profile gpu: `fit` against the bare loop, compile off and on, MFU
#   placements  the same script: compiled step time of prenorm and postnorm with the torch and triton backends
#   e2e       what `make train RECIPE=prenorm-12l PROFILE=gpu ARGS="--model.arch.norm_backend=triton ..."`
#             runs (make needs .venv, which the GPU machine lacks): compile + triton on Shakespeare, shortened
#             to E2E_STEPS optimizer steps, through validation, end-of-run evaluation and generation
#   profile   benchmarks/profile_step.py: the compiled gpu-profile step under torch.profiler, triton and torch
#             backends: kernels by GPU time, shares by kind (matmul, attention, Add & Norm, ...), Chrome trace
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
END=$((SECONDS + ${RUN_LIMIT_S:-570}))
E2E_STEPS=${E2E_STEPS:-150}
PY=${PY:-python3}

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
}

setup_offline() {
    # the GPU image lacks datasets and jsonargparse: install the carried wheels into /tmp/site
    if [ -d .whl ] && ! "$PY" -c "import datasets, jsonargparse" 2>/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            || { echo "gpu_session: installing .whl/ failed" >&2; exit 1; }
    fi
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
    if [ -d .devcache ]; then
        export RESNORM_LM_CACHE=$PWD/.devcache
    else
        echo "gpu_session: no .devcache/ here: run 'bash benchmarks/gpu_session.sh prepare' on a networked machine" >&2
    fi
    "$PY" -c "import datasets, jsonargparse" 2>/dev/null \
        || { echo "gpu_session: datasets/jsonargparse missing: run the prepare stage first" >&2; exit 1; }
}

versions() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
    "$PY" -c "import torch, triton, lightning; print('torch', torch.__version__, 'triton', triton.__version__, \
'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())"
    git log -1 --format='commit %h %s' 2>/dev/null || true
}

# run_stage NAME COMMAND...: the command under the time limit, output to the screen and <stage>/log.txt
run_stage() {
    local name=$1 dir=$OUT/$1 limit=$((END - SECONDS))
    shift
    [ -n "${STAGE_LIMIT_S:-}" ] && [ "$STAGE_LIMIT_S" -lt "$limit" ] && limit=$STAGE_LIMIT_S
    if [ "$limit" -lt 30 ]; then
        echo "=== $name: skipped, ${limit}s left of RUN_LIMIT_S: run it in a command of its own"
        return
    fi
    mkdir -p "$dir"
    echo "=== $name: $* (limit ${limit}s, $(date -u +%H:%M:%S) UTC)" | tee "$dir/log.txt"
    local t0=$SECONDS
    STAGE_DIR=$dir timeout --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$dir/log.txt"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - t0)) s$([ "$rc" = 124 ] && echo ' (time limit: cut short)')" \
        | tee -a "$dir/log.txt"
}

stage_prepare() {
    # on a networked machine: the wheels the GPU image lacks, and the Shakespeare data at the gpu profile's vocab
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 jsonargparse==4.53.0 \
        docstring_parser==0.18.0 typeshed_client==2.14.0
    "$PY" -m resnorm_lm.data prepare --corpus shakespeare --vocab-size 32768 --cache-dir .devcache
    du -sh .whl .devcache
    echo "prepared .whl/ and .devcache/: never commit them; carry both to the GPU machine (device tool: carry)"
}

stage_check() {
    versions
    # the conftest defaults (interpreter on, no GPU visible) are overridden here
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} "$PY" -m pytest -q -p no:cacheprovider tests/test_triton_gpu.py
}

stage_kernels() {
    # KERNEL_WIDTHS="768 1024 2048" and then "4096 8192", in two commands, if one is too short for all five
    # shellcheck disable=SC2086
    "$PY" benchmarks/bench_kernels.py --hidden ${KERNEL_WIDTHS:-768 1024 2048 4096 8192} --dtypes bfloat16 \
        --csv "$STAGE_DIR/kernels.csv"
}

stage_training() {
    "$PY" benchmarks/bench_training.py --profile gpu --only throughput --compile both \
        && cp benchmarks/results/training_gpu.csv "$STAGE_DIR/"
}

stage_placements() {
    "$PY" benchmarks/bench_training.py --profile gpu --only placements --compile on \
        && cp benchmarks/results/placements_gpu.csv "$STAGE_DIR/"
}

stage_e2e() {
    # `make train RECIPE=prenorm-12l PROFILE=gpu ARGS="..."` runs exactly this (Makefile), with .venv's python
    "$PY" -m resnorm_lm fit --recipe prenorm-12l --profile gpu --seed_everything 1 \
        --model.arch.norm_backend=triton --model.compile=true --data.corpus=shakespeare \
        --trainer.max_steps="$E2E_STEPS" --trainer.val_check_interval=$((E2E_STEPS * 4)) \
        --trainer.enable_progress_bar=false --run.root="$STAGE_DIR/runs"
    local run
    run=$(find "$STAGE_DIR/runs" -name metrics.csv -printf '%h\n' 2>/dev/null | head -1)
    [ -n "$run" ] && rm -rf "$run/checkpoints"  # checkpoints are large and say nothing here
    return 0
}

stage_profile() {
    "$PY" benchmarks/profile_step.py --backend triton --out "$STAGE_DIR/triton"
    "$PY" benchmarks/profile_step.py --backend torch --out "$STAGE_DIR/torch"
}

[ $# -ge 1 ] || usage
for stage in "$@"; do
    case $stage in
        prepare) stage_prepare ;;
        check | kernels | training | placements | e2e | profile)
            [ -n "${SETUP_DONE:-}" ] || { setup_offline; SETUP_DONE=1; }
            export -f "stage_$stage" versions
            export PY E2E_STEPS
            run_stage "$stage" bash -c "stage_$stage"
            ;;
        *) usage ;;
    esac
done
