# NodeGate: one entry point. `make demo` runs the live demo, `make test` runs every test, `make check`
# is the fast loop (static checks and the unit tests, under 3 minutes; no control plane).
# Both work on a fresh machine with Python 3.11 and Go; the control plane binaries are built once
# per machine into ~/.cache/nodegate (see gate/devcluster/versions.toml).

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: all demo test test-matrix check lint unit integration realnode realnode-deps binaries crds generate manifests chart clean-venv

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

binaries: $(STAMP)
	$(PY) -m gate.devcluster.build --link $(VENV)/bin

demo: binaries
	$(VENV)/bin/nodegate demo

lint: $(STAMP)
	$(VENV)/bin/ruff check gate tests bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

check: lint unit

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

integration: binaries
	$(PY) -m pytest tests/integration -q

# The real-node tier (tests/realnode) needs a few Debian tools on this machine; as root the script
# installs what is missing, otherwise the tier is skipped and says why (docs/realnodes.md).
realnode-deps:
	@bash hack/install-realnode-deps.sh || echo "real-node tier: its Debian tools are missing; tests/realnode will be skipped"

realnode: binaries realnode-deps
	$(PY) -m pytest tests/realnode -q

# Every tier, side by side: the tests wait on control planes and nodes far more than they use the two
# cores, so TEST_WORKERS pytest-xdist workers run them at once, each worker with control planes of its
# own (tests/conftest.py says what one worker runs whole, and in which order the work goes out).
# One run, one summary and one exit status: a failure in any tier fails it, and so does a run in which
# no test ran (pytest's 5). TEST_WORKERS=0 runs everything in one process, in order, as before.
# docs/development.md has each tier's time, serial and side by side.
TEST_WORKERS ?= 3

test: lint binaries realnode-deps
	$(PY) -m pytest tests -q --durations=15 -n $(TEST_WORKERS)

# Not part of `make test` or CI: the integration core once per Kubernetes release of versions.toml's
# [matrix] (each control plane built once per machine, several CPU-minutes each), then a table of
# release x passed/failed/time. KUBE_VERSIONS="v1.33.13" runs a subset (gate/devcluster/matrix.py).
test-matrix: binaries
	$(PY) -m gate.devcluster.matrix --report $(VENV)/test-matrix.txt

crds: $(STAMP)
	$(VENV)/bin/nodegate crds --output crds

# Everything generated from the models and the chart, in dependency order (tests fail when stale).
generate: binaries
	$(VENV)/bin/nodegate crds --output crds
	$(VENV)/bin/nodegate api-docs
	$(VENV)/bin/nodegate manifests

clean-venv:
	rm -rf $(VENV)

# The Helm chart: `make manifests` regenerates what is generated (the chart's RBAC rules from
# gate/controller/rbac.py, its CRDs, and the plain manifests operator/, webhooks/, certs/);
# `make chart` lints it and runs the rendering tests (no cluster needed).
.PHONY: manifests chart

manifests: binaries
	$(VENV)/bin/nodegate manifests

chart: binaries
	$(VENV)/bin/nodegate manifests --check
	$(PY) -m pytest tests/chart/test_render.py -q
