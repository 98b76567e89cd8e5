# `make demo` and `make test` each build the environment from scratch on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install data demo test lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,llm]'
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST: Debian's package when we can install it, else the official files (verified).
data: $(STAMP)
	@if ! $(BIN)/python -c "from taciturn.data import fashion_mnist as f; f.locate(allow_download=False)" 2>/dev/null \
	  && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get install -y -q dataset-fashion-mnist || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) || true; \
	fi
	$(BIN)/taciturn data fetch

demo: data
	$(BIN)/taciturn demo

test: data
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache
