# containerbench: `make run` measures, `make test` tests. Both set up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BENCH_VENV := .venv-bench
PROFILE ?= profiles/local
SNAKEMAKE_ARGS ?=

.PHONY: setup run test test-fast dry-run lock clean-results help

help:
	@echo "make run        set up, then run the benchmark workflow ($(PROFILE), config/config.yaml)"
	@echo "make test       set up, then run the whole test suite (root: it installs engines and Slurm)"
	@echo "make test-fast  the developer loop: tests that need only the workflow venv (no root, minutes)"
	@echo "make dry-run    show what the workflow would run"
	@echo "make lock       re-resolve envs/*.lock.txt from envs/*.txt"

setup: $(VENV)/.containerbench-ready $(BENCH_VENV)/.containerbench-ready build/engines/containers.conf

# Container engines for the runtimes the default config measures (podman,
# Charliecloud; docker when its daemon runs), and podman settings that work
# without systemd (runc, cgroupfs). Installed when running as root.
build/engines/containers.conf: scripts/container-engines.sh
	if [ "$$(id -u)" -eq 0 ]; then scripts/container-engines.sh install; fi
	scripts/container-engines.sh podman-conf build/engines >/dev/null

$(VENV)/.containerbench-ready: envs/workflow.lock.txt envs/build-tools.txt pyproject.toml scripts/setup-venv.sh
	PYTHON=$(PYTHON) scripts/setup-venv.sh workflow $(VENV)

$(BENCH_VENV)/.containerbench-ready: envs/bench.lock.txt envs/bench.txt envs/build-tools.txt pyproject.toml scripts/setup-venv.sh
	scripts/install-system-deps.sh
	PYTHON=$(PYTHON) scripts/setup-venv.sh bench $(BENCH_VENV)

# A CONTAINERS_CONF of the user's own wins over ours.
export CONTAINERS_CONF ?= $(CURDIR)/build/engines/containers.conf

run: setup
	$(VENV)/bin/snakemake --profile $(PROFILE) $(SNAKEMAKE_ARGS)

dry-run: $(VENV)/.containerbench-ready
	$(VENV)/bin/snakemake --profile $(PROFILE) --dry-run $(SNAKEMAKE_ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# No training, no container engine, no Slurm, no root: what each marker means is in pyproject.toml.
FAST := not slow and not bench and not root and not containers and not slurm and not netns
test-fast: $(VENV)/.containerbench-ready
	$(VENV)/bin/python -m pytest -m "$(FAST)" $(PYTEST_ARGS)

lock:
	scripts/lock-envs.sh

clean-results:
	rm -rf results .snakemake/log
