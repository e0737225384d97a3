# Two commands set everything up on a fresh machine:
#   make run    create .venv if needed, install rigdeck, open the app
#   make test   install what the tests need (Debian packages too, as root) and run the suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch that this machine serves locally; on a GPU workstation
# set TORCH_SPEC to the build that fits its CUDA.
TORCH_SPEC ?= torch==2.13.0
# The suite runs on the newest paramiko the hub's copy of its loop was checked against
# (tui/remote/hub.py VERIFIED): rigdeck itself takes any paramiko its pin allows (an unchecked one
# gets paramiko's own threads), but the hub's tests need the hub. `make test
# PARAMIKO_SPEC=paramiko` tries the newest; test_hub names what to check when it differs.
PARAMIKO_SPEC ?= paramiko==5.1.0
# bench/goodput.py's ft_launcher side (NVIDIA's resiliency extension), without its dependencies:
# torch is the one above; pyproject's bench extra has the others, and says why not pynvml.
NVRX_SPEC ?= nvidia-resiliency-ext==0.4.1
DEB_PACKAGES := openssh-server openssh-client openmpi-bin iproute2 tmux iptables procps fish chromium rsync prometheus prometheus-node-exporter slurm-wlm munge slurmdbd mariadb-server podman runc mmdebstrap uidmap docker.io
PYTEST_ARGS ?=
# The suite runs in this many pytest-xdist workers, a test module to a worker, each worker with a
# test bed of its own; tests marked `quiet` (they measure speed) run after them, alone. The tests
# mostly wait on processes and links, so three workers keep two cores busy.
PYTEST_WORKERS ?= 3
# The files that hold `quiet` tests: the quiet phase collects only these (or PYTEST_ARGS' own).
QUIET_FILES = $(shell grep -l 'pytest.mark.quiet' tests/test_*.py)
# Tools the tests find on PATH that the machine has but not on PATH (see python39).
TOOLS := $(CURDIR)/.tools/bin

.PHONY: run test sysdeps python39 image install install-test lint bytecode screenshots bench clean testbed-down

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,train,dev]" "$(PARAMIKO_SPEC)"
	touch $@

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed-test
	$(PY) -m pip install -q --no-deps "$(NVRX_SPEC)"
	$(PY) -m pip install -q -e ".[bench]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: $(VENV)/.installed bytecode
	$(VENV)/bin/rigdeck

# Debian packages the test bed and launchers need; installed only when missing and root.
sysdeps:
	@missing=""; \
	command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v ssh >/dev/null || missing="$$missing openssh-client"; \
	command -v mpirun >/dev/null || missing="$$missing openmpi-bin"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v tmux >/dev/null || missing="$$missing tmux"; \
	command -v fish >/dev/null || missing="$$missing fish"; \
	command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing="$$missing iptables"; \
	command -v pkill >/dev/null || missing="$$missing procps"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v promtool >/dev/null && command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	[ -x /usr/bin/prometheus-node-exporter ] || missing="$$missing prometheus-node-exporter"; \
	[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null || missing="$$missing slurm-wlm"; \
	[ -x /usr/sbin/munged ] || missing="$$missing munge"; \
	[ -x /usr/sbin/slurmdbd ] || missing="$$missing slurmdbd"; \
	[ -x /usr/sbin/mariadbd ] && [ -x /usr/bin/mariadb-install-db ] || missing="$$missing mariadb-server"; \
	command -v podman >/dev/null || missing="$$missing podman"; \
	command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing="$$missing runc"; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	command -v newuidmap >/dev/null || missing="$$missing uidmap"; \
	command -v dockerd >/dev/null || [ -x /usr/sbin/dockerd ] || missing="$$missing docker.io"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages:$$missing (not root: the test bed tests will skip)"; \
	  fi; \
	fi

# agent/ and runtime/ must run on Python 3.9: the tests take `python3.9` from PATH. Debian 12
# has no python3.9 package and uv's builds come from GitHub, so when PATH has no working one
# (a pyenv shim for a version not selected does not run), a 3.9 that pyenv installed is linked
# into $(TOOLS), first on the tests' PATH; failing that, apt where it has python3.9.
python39:
	@export PATH="$(TOOLS):$$PATH"; \
	ok() { "$$1" -c 'import sys; assert sys.version_info[:2] == (3, 9)' 2>/dev/null; }; \
	if ok python3.9; then exit 0; fi; \
	if command -v pyenv >/dev/null; then \
	  for v in $$(pyenv versions --bare 2>/dev/null | grep -E '^3\.9(\.[0-9]+)?$$'); do \
	    p="$$(pyenv root)/versions/$$v/bin/python3.9"; \
	    if ok "$$p"; then mkdir -p $(TOOLS) && ln -sf "$$p" $(TOOLS)/python3.9; exit 0; fi; \
	  done; \
	fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq; \
	  if apt-cache show python3.9 >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3.9 >/dev/null; \
	    exit 0; \
	  fi; \
	fi; \
	echo "no Python 3.9 here (Debian has none; pyenv install 3.9 gives one): its tests skip," \
	  "and fail under RIGDECK_REQUIRE_TESTBED=1"

# The image [container] jobs' tests run (tests/containerimage.py; their fixture builds it when
# the cache has none, so `make test` needs no step of its own): built once per recipe into
# /var/cache/rigdeck/images/<hash>.tar (Debian bookworm minbase by mmdebstrap, and the suite's CPU
# torch by pip; about 3 minutes and 1 GB the first time), then loaded into podman's store.
# Nothing comes from a container registry. As root only (not root: the container tests skip).
image: sysdeps $(VENV)/.installed-test
	@if [ "$$(id -u)" = 0 ] && command -v podman >/dev/null && command -v mmdebstrap >/dev/null; then \
	  $(PY) -m tests.containerimage; \
	else \
	  echo "no test image (needs root, podman and mmdebstrap): the container tests skip"; \
	fi

# Bytecode for rigdeck's own modules, as a wheel install has (an editable one writes it only on
# first import, and never under PYTHONDONTWRITEBYTECODE): each command then starts as a user's does.
bytecode: $(VENV)/.installed
	$(PY) -m compileall -q tui agent runtime >/dev/null

test: sysdeps python39 $(VENV)/.installed-test bytecode
	PATH="$(TOOLS):$$PATH" $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not quiet" --durations=30 $(PYTEST_ARGS)
	PATH="$(TOOLS):$$PATH" $(PY) -m pytest -m quiet $(if $(PYTEST_ARGS),,$(QUIET_FILES)) $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: none selected

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check tui agent runtime tests bench
	$(VENV)/bin/mypy tui agent runtime

screenshots: sysdeps $(VENV)/.installed-test
	$(PY) -m tests.screenshots
	$(PY) -m tests.webpage

# Every benchmark in sequence (the test bed ones need root); each writes bench/results/<name>.json.
bench: sysdeps $(VENV)/.installed-test $(VENV)/.installed-bench image
	$(PY) bench/deploy.py
	$(PY) bench/telemetry.py
	$(PY) bench/scale.py
	$(PY) bench/launch.py --rounds 5 --steps 300
	$(PY) bench/container.py --rounds 3 --steps 150
	$(PY) bench/runtime.py
	$(PY) bench/ui.py
	$(PY) bench/attach.py
	$(PY) bench/sweep.py --rounds 3
	$(PY) bench/sweep_quality.py
	$(PY) bench/sync.py --rounds 3
	$(PY) bench/goodput.py
	$(PY) bench/snapshot_cost.py
	$(PY) bench/exporter.py

testbed-down: $(VENV)/.installed
	$(PY) -m tests.testbed down

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .tools
