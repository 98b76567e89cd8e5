# `make demo` and `make test` each build the environment from scratch on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install wheel data demo test soak lint clean mutation vision-env

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,llm,hf,ray,flower,dp,secagg,tensorboard,mlflow]'
	touch $(STAMP)

install: $(STAMP)

# The wheel every machine of a deployment installs (docs/deploy.md, step 0); no venv needed
wheel:
	rm -rf build
	$(PYTHON) -m pip wheel --quiet --no-deps -w dist .
	rm -rf build
	@ls dist/taciturn-*.whl

# Fashion-MNIST: Debian's package when we can install it, else the official files (verified).
data: $(STAMP)
	@if ! $(BIN)/python -c "from taciturn.data import fashion_mnist as f; f.locate(allow_download=False)" 2>/dev/null \
	  && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get install -y -q dataset-fashion-mnist || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) || true; \
	fi
	$(BIN)/taciturn data fetch

demo: data
	$(BIN)/taciturn demo

# torchvision's example runs in an environment of its own (constraints-vision.txt says why)
VISION := .venv-vision
$(VISION)/.installed: pyproject.toml constraints-vision.txt
	$(PYTHON) -m venv $(VISION)
	$(VISION)/bin/pip install --quiet -c constraints-vision.txt -e '.[vision]'
	touch $@

vision-env: $(VISION)/.installed

test: data vision-env
	TACITURN_VISION_PYTHON=$(CURDIR)/$(VISION)/bin/python $(BIN)/python -m pytest

# the fuzz suite (tests/test_fuzz.py) with 50 times the examples `make test` runs
soak: data
	TACITURN_FUZZ_SCALE=50 $(BIN)/python -m pytest -m fuzz

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Mutation testing (tools/mutation.py, scores in docs/mutation.md): CPU-heavy, not part of test.
mutation: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[mutation]'
	$(BIN)/python tools/mutation.py

clean:
	rm -rf $(VENV) $(VISION) runs .pytest_cache build dist

# ----- benchmark anchors (benchmarks/speed.py): Flower and pfl-research, each in its own venv -----
# Two venvs because pfl pins attrs==23.2.0, which conflicts with Flower's. Never package dependencies.
# torch first, from the constraints (torch==2.13.0, the CPU wheel), so neither framework pulls a CUDA build.
BENCH_VENVS := benchmarks/.venv-flower/.installed benchmarks/.venv-pfl/.installed

.PHONY: bench-env

bench-env: $(BENCH_VENVS)

benchmarks/.venv-flower/.installed: constraints.txt
	$(PYTHON) -m venv benchmarks/.venv-flower
	benchmarks/.venv-flower/bin/pip install --quiet -c constraints.txt torch numpy
	benchmarks/.venv-flower/bin/pip install --quiet -c constraints.txt 'flwr[simulation]'
	touch $@

benchmarks/.venv-pfl/.installed: constraints.txt
	$(PYTHON) -m venv benchmarks/.venv-pfl
	benchmarks/.venv-pfl/bin/pip install --quiet -c constraints.txt torch numpy
	benchmarks/.venv-pfl/bin/pip install --quiet -c constraints.txt 'pfl[pytorch]'
	touch $@
