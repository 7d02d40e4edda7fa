# resnorm-lm: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TORCH_PIN := torch==2.13.0
# An index pip also looks in for torch, e.g. https://download.pytorch.org/whl/cpu for the CPU build (on Linux the
# public registry's torch is the CUDA build). Empty: pip's own configuration decides.
TORCH_INDEX ?=

RECIPE ?= prenorm-12l
PROFILE ?= auto
SEED ?= 1
RESUME ?=
LOGGER ?=
ARGS ?=
DATA ?= shakespeare
RUNS ?=
SUITE ?=
RECIPES ?=
SEEDS ?= 1
LRS ?=
WARMUPS ?=
DEPTHS ?=
LRS_AT ?=
JOBS ?= 1
LAUNCHER ?= local

AVX2_ONLY := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
NUMERIC_TESTS := tests/test_norms.py tests/test_norm_properties.py tests/test_triton_kernels.py \
	tests/test_placements.py tests/test_model.py tests/test_gradient_flow.py tests/test_precision.py \
	tests/test_loss.py tests/test_cpu_attention.py tests/test_recorded_numbers.py

# pytest-xdist: one worker per core, at most 4 (each test process runs one thread: tests/conftest.py), a test
# file's tests kept in one worker so that its module fixtures are made once. TEST_WORKERS= runs one process.
TEST_WORKERS ?= -n auto --maxprocesses=4 --dist loadfile

.PHONY: help install test test-quick test-full test-avx2 lint format train data eval compare suite bench bench-kernels notebooks clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# .venv is made, or made again where it is half made (scripts/ensure_venv.sh), then its packages installed. The
# targets that need .venv depend on the stamp, and through $(PY) on its python: a link to a removed one remakes it.
$(STAMP): pyproject.toml constraints.txt setup.py $(PY)
	@bash scripts/ensure_venv.sh $(PYTHON) $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
		-c constraints.txt $(TORCH_PIN) -e ".[dev,triton,notebooks]"
	@touch $(STAMP)

$(PY):

install: ## Create .venv with the pinned dependencies, or repair a half-made one (quick when up to date) [TORCH_INDEX=<url>]
	@bash scripts/ensure_venv.sh $(PYTHON) $(VENV)
	@$(MAKE) --no-print-directory $(STAMP)

test: $(STAMP) ## Fast test suite (CPU, no network; installs first when needed): what CI runs [TEST_WORKERS=]
	$(PY) -m pytest -q $(TEST_WORKERS) -m "not slow"

test-quick: $(STAMP) ## The inner loop, under a minute: make test without the tests that train or start processes
	$(PY) -m pytest -q -m "not slow and not training"  # one process: workers cost more to start than they save here

test-full: $(STAMP) ## Every test, the slow ones included
	$(PY) -m pytest -q $(TEST_WORKERS)

test-avx2: $(STAMP) ## The numerical tests again with kernels capped at AVX2 (a CPU without AVX-512 or native bf16)
	$(AVX2_ONLY) $(PY) -m pytest -q $(TEST_WORKERS) -m "not slow" $(NUMERIC_TESTS)

lint: $(STAMP) ## ruff check and format check
	$(VENV)/bin/ruff check resnorm_lm tests benchmarks scripts docs/results notebooks/run_notebooks.py setup.py
	$(VENV)/bin/ruff format --check resnorm_lm tests benchmarks scripts docs/results notebooks/run_notebooks.py setup.py

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix resnorm_lm tests benchmarks scripts docs/results setup.py
	$(VENV)/bin/ruff format resnorm_lm tests benchmarks scripts docs/results setup.py

train: $(STAMP) ## Train RECIPE=<name> [PROFILE=auto|cpu|gpu|smoke] [RESUME=last|<ckpt>] [SEED=k] [LOGGER=wandb] [ARGS="..."]
	$(PY) -m resnorm_lm fit --recipe $(RECIPE) --profile $(PROFILE) --seed_everything $(SEED) \
		$(if $(RESUME),--ckpt_path $(RESUME)) $(if $(LOGGER),--run.logger $(LOGGER)) $(ARGS)

data: $(STAMP) ## Prepare DATA=<corpus> (download, tokenizer, token bins) and print its manifest
	$(PY) -m resnorm_lm.data prepare --corpus $(DATA) $(ARGS)

eval: $(STAMP) ## Perplexity table for RUNS="<run dirs or ckpts>"
	@test -n "$(RUNS)" || { echo 'make eval: give RUNS="runs/<recipe>/<profile>-seed<k> ..." (run directories or .ckpt files)'; exit 2; }
	$(PY) -m resnorm_lm eval $(RUNS) $(ARGS)

compare: $(STAMP) ## Sweep RECIPES="..." over [LRS] [WARMUPS] [DEPTHS="6 12"] [LRS_AT="48=lr,lr"], pick on val, test at the pick [SEEDS] [JOBS] [LAUNCHER=local|slurm]
	$(PY) -m resnorm_lm compare --profile $(PROFILE) --seeds $(SEEDS) --jobs $(JOBS) --launcher $(LAUNCHER) \
		$(if $(RECIPES),--recipes $(RECIPES)) \
		$(if $(LRS),--lrs $(LRS)) $(if $(WARMUPS),--warmups $(WARMUPS)) $(if $(DEPTHS),--depths $(DEPTHS)) \
		$(if $(LRS_AT),--lrs-at $(LRS_AT)) $(ARGS)

suite: $(STAMP) ## Train and render a pre-registered suite SUITE=<name> (recipes/suites/) [JOBS: default one per core] [ARGS]
	@test -n "$(SUITE)" || { echo "make suite: name one: SUITE=<name> ($$(ls recipes/suites | sed 's/\.yaml$$//' | tr '\n' ' '))" >&2; exit 2; }
	$(PY) -m resnorm_lm suite $(SUITE) $(if $(filter command line environment,$(origin JOBS)),--jobs $(JOBS)) $(ARGS)

bench: $(STAMP) ## Training-loop and norm benchmarks on this machine
	$(PY) benchmarks/bench_training.py $(ARGS)

bench-kernels: $(STAMP) ## Fused Triton kernel benchmark (needs a CUDA GPU)
	$(PY) benchmarks/bench_kernels.py $(ARGS)

notebooks: $(STAMP) ## Execute the notebooks
	$(PY) notebooks/run_notebooks.py $(ARGS)

clean: ## Remove caches and build outputs (keeps .venv, runs/ and the data cache)
	rm -rf .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
