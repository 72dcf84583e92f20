# containerbench: `make run` measures, `make test` tests. Both set up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BENCH_VENV := .venv-bench
TORCH_VENV := .venv-bench-torch
DEBIAN_MPICH := /usr/lib/x86_64-linux-gnu/libmpich.so.12
HOST_MPI := build/host-mpi/lib/libmpich.so.12
PROFILE ?= profiles/local
SNAKEMAKE_ARGS ?=

.PHONY: setup ready base-image test-wheelhouses run test test-fast lint dry-run lock clean-results clean-images help gpu-env test-gpu-env

help:
	@echo "make run        set up, then run the benchmark workflow ($(PROFILE), config/config.yaml)"
	@echo "make test       set up, then run the whole test suite (root: it installs engines and Slurm); the fast tests run beside setup"
	@echo "make ready      what run and test do first: setup and the base image (for test also the MPICH wheel), two at a time"
	@echo "make test-fast  the developer loop: lint, then the tests that need only the workflow venv (no root, minutes)"
	@echo "make lint       ruff over the Python, snakefmt --check over the Snakefile and rules (pyproject.toml)"
	@echo "make dry-run    show what the workflow would run"
	@echo "make clean-images  remove the built images (every flavour of IMAGE_TAG) from the engines and build/images"
	@echo "make lock       re-resolve envs/*.lock.txt from envs/*.txt"
	@echo "make gpu-env    the GPU benchmark venv (.venv-bench-gpu) and its NCCL Horovod wheel (benchmark_env: gpu)"
	@echo "make test-gpu-env  build it, and the GPU image from it, and test both (opt-in: 5 GB, 15-30 minutes)"

setup: $(VENV)/.containerbench-ready $(BENCH_VENV)/.containerbench-ready $(TORCH_VENV)/.containerbench-ready build/engines/containers.conf $(HOST_MPI)

# What `make run` and `make test` need first, two things at a time: the base image (debootstrap's
# downloads and unpacking) is made beside the benchmark venv's pip installs and Horovod compile
# instead of after them, in the first workflow run. The system packages go first, one apt-get at a time.
ready:
	$(MAKE) --no-print-directory --jobs=2 setup base-image $(READY_ALSO)

# The base the container builds start from (debootstrap, then import into podman): the workflow's
# image_base step finds it there (baseimage.make_base keeps an existing base). Not fatal here: without
# a usable podman the workflow says which runtimes it skips, and why. A site whose config names its
# own base (images.build.base_image) has no use for it: `make setup`, then snakemake, skips it.
BASE_LOG := build/logs/images/base-make.txt
base-image: $(VENV)/.containerbench-ready build/engines/containers.conf
	@mkdir -p $(dir $(BASE_LOG))
	@if $(VENV)/bin/python -m containerbench image --engine podman base > $(BASE_LOG) 2>&1; then \
	  echo "base image: $$(tail -n 1 $(BASE_LOG))"; \
	else echo "base image: not made here ($(BASE_LOG)): $$(tail -n 1 $(BASE_LOG))"; fi

# What `make test` readies beside setup: the native MPI model's image (the MPICH flavour) needs a Horovod
# wheel compiled against MPICH (2.5 to 5 minutes on two cores). The container tests' workflow would
# compile it first, on the critical path of its image steps; here it runs beside the base and the PyTorch
# venv. The same step the workflow runs (wheelhouse.make_flavour_wheelhouse), which then finds the wheel made
# and links the rest of the wheels. Not fatal here: the workflow runs the step again and its log says what failed.
WHEELHOUSE_LOG := build/logs/images/wheelhouses-make.txt
test-wheelhouses: $(VENV)/.containerbench-ready $(BENCH_VENV)/.containerbench-ready
	@mkdir -p $(dir $(WHEELHOUSE_LOG))
	@if $(VENV)/bin/python -m containerbench image --mpi mpich wheelhouse > $(WHEELHOUSE_LOG) 2>&1; then \
	  echo "wheelhouses: made ($(WHEELHOUSE_LOG))"; \
	else echo "wheelhouses: not made here ($(WHEELHOUSE_LOG)): $$(tail -n 1 $(WHEELHOUSE_LOG))"; fi

# Once, not on every `make run`: a stamp, after the engines' apt-get (never two at once).
SYSTEM_DEPS := build/system-deps.done
$(SYSTEM_DEPS): scripts/install-system-deps.sh | build/engines/containers.conf
	scripts/install-system-deps.sh
	@mkdir -p $(dir $@) && touch $@

# The native MPI model's host MPI (config/native.yaml): this machine's MPICH and every library it loads in a
# directory of their own, as a site's MPI is installed; Debian's /usr/lib cannot be bound over an image's.
# Not fatal here: without MPICH the native runs' node-mpi step says what is missing.
$(HOST_MPI): scripts/host-mpi-tree.sh | $(SYSTEM_DEPS)
	@if [ -e $(DEBIAN_MPICH) ]; then scripts/host-mpi-tree.sh $(DEBIAN_MPICH) build/host-mpi; \
	else echo "host MPI: no $(DEBIAN_MPICH) here, so no build/host-mpi for config/native.yaml"; fi

# Container engines for the runtimes the default config measures (podman,
# Charliecloud; docker when its daemon runs), and podman settings that work
# without systemd (runc, cgroupfs). Installed when running as root.
build/engines/containers.conf: scripts/container-engines.sh
	if [ "$$(id -u)" -eq 0 ]; then scripts/container-engines.sh install; fi
	scripts/container-engines.sh podman-conf build/engines >/dev/null

$(VENV)/.containerbench-ready: envs/workflow.lock.txt envs/build-tools.txt pyproject.toml scripts/setup-venv.sh
	PYTHON=$(PYTHON) scripts/setup-venv.sh workflow $(VENV)

$(BENCH_VENV)/.containerbench-ready: envs/bench.lock.txt envs/bench.txt envs/build-tools.txt pyproject.toml scripts/setup-venv.sh | $(SYSTEM_DEPS)
	PYTHON=$(PYTHON) scripts/setup-venv.sh bench $(BENCH_VENV)

# The PyTorch side (benchmark.frameworks: [..., pytorch]): about a minute, 750 MB.
$(TORCH_VENV)/.containerbench-ready: envs/bench-torch.lock.txt envs/bench-torch.txt envs/build-tools.txt pyproject.toml scripts/setup-venv.sh | $(SYSTEM_DEPS)
	PYTHON=$(PYTHON) scripts/setup-venv.sh bench-torch $(TORCH_VENV)

# For the scripts make runs (the base image); the workflow sets it itself when its runs are launched
# here (runtimes.Podman.engine_environment). A CONTAINERS_CONF of the user's own wins over ours.
export CONTAINERS_CONF ?= $(CURDIR)/build/engines/containers.conf

run: ready
	$(VENV)/bin/snakemake --profile $(PROFILE) $(SNAKEMAKE_ARGS)

dry-run: $(VENV)/.containerbench-ready
	$(VENV)/bin/snakemake --profile $(PROFILE) --dry-run $(SNAKEMAKE_ARGS)

# The make program through a variable of its own: a recipe line that spells $(MAKE) runs even under
# `make -n`, which would run the suite instead of printing it.
MAKE_PROGRAM = $(MAKE)

# `make ready` with the MPICH flavour's wheel, and every test but the GPU environment's: those that need only
# the workflow venv (FAST) run beside the rest of ready, the others after it (scripts/test-suite.sh).
test:
	MAKE="$(MAKE_PROGRAM)" VENV=$(VENV) SYSTEM_DEPS=$(SYSTEM_DEPS) scripts/test-suite.sh "$(FAST)" $(PYTEST_ARGS)

# No training, no container engine, no Slurm, no root: what each marker means is in pyproject.toml.
FAST := not slow and not bench and not root and not containers and not slurm and not netns and not gpu_env
test-fast: lint
	$(VENV)/bin/python -m pytest -m "$(FAST)" $(PYTEST_ARGS)

# Seconds, so the loop runs it first; what each checks, and what it leaves out, is in pyproject.toml.
lint: $(VENV)/.containerbench-ready
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/snakefmt --check Snakefile workflow/rules

# benchmark_env: gpu. Compiling Horovod's NCCL operations needs CUDA 11.8's nvcc and gcc 11
# (installed when root on Debian); the GPU venv and image need no GPU to be built.
BENCH_GPU_VENV := .venv-bench-gpu
gpu-env: $(BENCH_GPU_VENV)/.containerbench-ready

$(BENCH_GPU_VENV)/.containerbench-ready: envs/bench-gpu.lock.txt envs/bench-gpu.txt envs/build-tools.txt pyproject.toml scripts/setup-venv.sh | $(SYSTEM_DEPS)
	scripts/install-system-deps.sh --gpu-build
	PYTHON=$(PYTHON) scripts/setup-venv.sh bench-gpu $(BENCH_GPU_VENV)

test-gpu-env: setup gpu-env
	$(VENV)/bin/python -m pytest -m gpu_env $(PYTEST_ARGS)

lock:
	scripts/lock-envs.sh

clean-results:
	rm -rf results .snakemake/log

# About 2 GB per flavour in the engine's store and as much again per Charliecloud directory;
# the next workflow run builds what it needs again (the base and wheelhouses are kept).
IMAGE_TAG ?= localhost/containerbench:latest
clean-images: $(VENV)/.containerbench-ready
	$(VENV)/bin/python -m containerbench image --tag $(IMAGE_TAG) remove --every-flavour
