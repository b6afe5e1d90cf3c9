# Quick start:  make serve   (the real vLLM OpenAI server on the CPU, embedded random-weight model)
#               make test    (every test; installs what it needs first)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
# The stamp depends on everything that decides the environment's content, so `make venv` re-runs
# only when one of them changes and is a no-op (seconds) otherwise.
STAMP := $(VENV)/.installed

.PHONY: venv serve test lock clean
venv: $(STAMP)

$(STAMP): requirements/cpu.lock pyproject.toml scripts/torchvision_cpu_shim.py
	@echo "== creating $(VENV) from requirements/cpu.lock (cold: a few minutes; then cached)"
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --no-deps -r requirements/cpu.lock
	$(VPY) -m pip install --quiet --no-deps -e .
	$(VPY) scripts/torchvision_cpu_shim.py
	@touch $@

serve: venv
	$(VPY) entrypoint.py $(ARGS)

test: venv
	$(VPY) -m pytest $(PYTEST_ARGS)

# Re-resolve requirements/cpu.in into requirements/cpu.lock in a scratch venv.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install --quiet -r requirements/cpu.in
	.venv-lock/bin/pip uninstall --quiet -y torchaudio torchcodec
	{ sed -n '1,3p' requirements/cpu.lock; .venv-lock/bin/pip freeze; } > requirements/cpu.lock.new
	mv requirements/cpu.lock.new requirements/cpu.lock && rm -rf .venv-lock

clean:
	rm -rf $(VENV) .venv-lock
