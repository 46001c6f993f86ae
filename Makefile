# kubeinfer: the entry points people type. README.md and .ci/run use these names.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help setup test test-unit test-integration test-e2e lint lock crds cluster-up cluster-down demo run \
        bench bench-runtime bench-frontend bench-operator bench-cache bench-autoscaler \
        bench-autoscaler-adversary bench-autoscaler-frontier bench-autoscaler-zero bench-peers bench-hostile bench-perf-analyzer \
        bench-cold-start bench-token-budget bench-pool clean images

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | column -t -s $$'\t'

setup: ## idempotent: .venv from the lock (requirements/lock.txt) + package, .cache/kserve-client (KServe SDK, requirements/kserve-client.txt), Debian packages (prometheus, runc, CNI, buildah...), Kubernetes, containerd, CoreDNS and helm binaries, MinIO and crane for the model-source tests, perf_analyzer (hack/perf-analyzer.pins) (hack/setup.sh)
	@bash hack/setup.sh

# The slowest tests (pytest's --durations) and the time of each tier (tests/support/durations.py) close
# every run, so the suite's budget (docs/development.md, "Durations") stays in sight.
PYTEST_DURATIONS := --durations=30 --durations-min=1

# The unit and integration tiers on two workers, a test file per worker at a time (module fixtures stay
# whole): their tests wait on processes and servers as much as they compute, so two take about 60 % of
# one's wall time on 2 cores. One pytest per tier, so that each tier's time is its own.
PYTEST_WORKERS := -n 2 --dist loadfile
# The integration tier on three: its tests wait longer still (runtime processes starting, API servers),
# and side by side on the quiet 2-core machine three workers took it from 633 s to 496 s (the CPU busy
# 74 % of the time with two, 87 % with three).
INTEGRATION_WORKERS := -n 3 --dist loadfile

# hack/test.sh: the unit tier while the images load into the node's image store, then the integration
# tier beside the e2e tier (one node cluster per machine: the e2e tier is one pytest; its modules that
# time the node's CPU run last, after the integration tier). Every tier runs even if one before it failed.
test: images ## setup and images, then the unit tests while the images load into the node's store, then the integration tests beside the end-to-end (real node) tests; prints the 30 slowest and each tier's time
	@bash hack/test.sh $(PY) "$(PYTEST_DURATIONS) $(PYTEST_WORKERS)" "$(PYTEST_DURATIONS) $(INTEGRATION_WORKERS)" \
	  "$(PYTEST_DURATIONS)"

test-unit: ## unit tests only (no setup of the control plane; two workers)
	@$(PY) -m pytest $(PYTEST_DURATIONS) $(PYTEST_WORKERS) tests/unit

test-integration: setup ## integration tests only (three workers)
	@$(PY) -m pytest $(PYTEST_DURATIONS) $(INTEGRATION_WORKERS) tests/integration

test-e2e: images ## end-to-end tests only: images, a one-node cluster, the chart, examples (needs root)
	@$(PY) -m pytest $(PYTEST_DURATIONS) tests/e2e

lint: ## ruff, mypy (strict on kubeinfer/contract/, kubeinfer/shared/, operator/, runtime/ and activator/), import-linter
	@bash hack/setup.sh --python-only
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	@# mypy and import-linter cannot follow setuptools' package-dir mapping: give them a symlinked
	@# kubeinfer/ tree, so kubeinfer.* imports are checked (not Any) and modules get their real names.
	@# One at a time per checkout (flock): a second `make lint` removed that tree and shared mypy's
	@# cache under a running one (mypy INTERNAL ERROR on whichever module it was reading). mypy's cache
	@# lives beside the tree, in .cache/mypy, so that a second run checks only what changed.
	@mkdir -p .cache && flock .cache/lint.lock bash -c '\
	  set -e; rm -rf .cache/lintroot && mkdir -p .cache/lintroot/kubeinfer; \
	  ln -s "$(CURDIR)/kubeinfer/__init__.py" .cache/lintroot/kubeinfer/__init__.py; \
	  ln -s "$(CURDIR)/kubeinfer/contract" .cache/lintroot/kubeinfer/contract; \
	  ln -s "$(CURDIR)/kubeinfer/shared" .cache/lintroot/kubeinfer/shared; \
	  ln -s "$(CURDIR)/operator" .cache/lintroot/kubeinfer/operator; \
	  ln -s "$(CURDIR)/runtime" .cache/lintroot/kubeinfer/runtime; \
	  ln -s "$(CURDIR)/activator" .cache/lintroot/kubeinfer/activator; \
	  cd .cache/lintroot; \
	  echo "mypy --config-file pyproject.toml kubeinfer"; \
	  "$(CURDIR)/.venv/bin/mypy" --config-file "$(CURDIR)/pyproject.toml" --cache-dir "$(CURDIR)/.cache/mypy" kubeinfer; \
	  echo "lint-imports"; "$(CURDIR)/.venv/bin/lint-imports" --no-cache "$(CURDIR)/pyproject.toml"'

lock: ## rewrite the lock, requirements/*.txt, from pyproject.toml's ranges (uv pip compile; pins kept); UPGRADE=1: newest allowed, UPGRADE=NAME: that package
	@bash hack/setup.sh --python-only
	$(PY) hack/lock.py $(if $(filter 1,$(UPGRADE)),--upgrade,$(if $(UPGRADE),--upgrade-package $(UPGRADE)))

crds: ## regenerate crds/ and charts/kubeinfer/crds/ from the pydantic models
	$(PY) -m kubeinfer.operator.crdgen

images: setup ## build the base, pause, operator and runtime images with buildah (only those whose inputs changed)
	@$(PY) hack/images.py build

cluster-up: images ## start a one-node cluster (control plane, containerd, kubelet, kube-proxy, CoreDNS; root); prints the kubeconfig
	@$(PY) hack/cluster.py up

cluster-down: ## stop the local cluster and remove everything it made (processes, pods, mounts, bridge, rules)
	@$(PY) hack/cluster.py down

run: ## run the operator locally against $$KUBECONFIG
	.venv/bin/kubeinfer-operator

demo: setup ## the main job, end to end, on a one-node cluster (real pods; root) with the bundled model
	@$(PY) hack/demo.py

# The benchmarks that measure take the machine-wide bench lock and refuse a 1-minute load average
# over 0.5 (bench/quiet.py); NOISY=1 passes --noisy: they run anyway and mark the result noisy.
BENCH_NOISY := $(if $(filter 1,$(NOISY)),--noisy)

bench-runtime: setup ## runtime benchmark, MiniLM on torch and ONNX Runtime, fp32 and int8-dynamic -> bench/results/runtime.json
	$(PY) bench/runtime_bench.py $(BENCH_NOISY)

bench-frontend: setup ## front-end CPU per request and max rate (REST JSON/binary, gRPC; floor, under uvicorn and granian: venv .cache/bench-granian, installed here) -> bench/results/frontend.json
	@bash hack/setup.sh --bench-granian
	$(PY) bench/frontend_bench.py $(BENCH_NOISY)

bench-operator: setup ## operator benchmark -> bench/results/operator.json
	$(PY) bench/operator_bench.py $(BENCH_NOISY)

bench-cache: setup ## response cache: hit latency, max rate with 50 % repeats vs none -> bench/results/cache.json
	$(PY) bench/cache_bench.py $(BENCH_NOISY)

bench-peers: setup ## kubeinfer vs MLServer, LitServe (on its own int8 graph) and infinity-emb, each at its best setting (venvs .cache/peer-*, installed here), 35-45 min -> bench/results/peers.json
	@bash hack/setup.sh --peers
	$(PY) bench/peers_bench.py $(BENCH_NOISY)

bench-hostile: setup ## hostile request bodies: peak and retained RSS and liveness latency per case, one process and front ends -> bench/results/hostile.json
	$(PY) bench/hostile_bench.py $(BENCH_NOISY)

bench-perf-analyzer: setup ## Triton's perf_analyzer on MiniLM and simple, REST and gRPC, concurrency 1-8: its server-side breakdown beside /metrics -> bench/results/perf_analyzer.json
	$(PY) bench/perf_analyzer_bench.py $(BENCH_NOISY)

bench-token-budget: setup ## MiniLM under short requests with 5 % 10,000-character ones (overflow chunk, truncate): the short requests' P99 with and without maxBatchTokens, medians over repeats -> bench/results/token_budget.json
	$(PY) bench/token_budget.py $(BENCH_NOISY)

bench-cold-start: images ## cold starts from zero on the local one-node cluster (root; MiniLM int8 on onnxruntime, a graph cache volume, the image present): each stage from the demand to the first answer, empty then warm cache -> bench/results/cold_start.json
	$(PY) bench/cold_start.py $(BENCH_NOISY)

bench-pool: setup ## 20 tiny models under Zipf traffic: one model pool against one service per model (memory-seconds, hot models' P99, a cold model's first request) -> bench/results/pool.json
	$(PY) bench/pool.py $(BENCH_NOISY)

bench-autoscaler: setup ## autoscaler simulation -> bench/results/autoscaler.json
	$(PY) bench/autoscaler_sim.py

bench-autoscaler-adversary: setup ## steps where kubeinfer/HPA stand lower -> bench/results/autoscaler_adversary.json
	$(PY) bench/autoscaler_adversary.py

bench-autoscaler-frontier: setup ## kubeinfer vs its peers at every setting (HPA on GPU utilization, KEDA request rate, Knative KPA, Ray Serve): dominated or not, per trace -> bench/results/autoscaler_frontier.json
	$(PY) bench/autoscaler_frontier.py

bench-autoscaler-zero: setup ## scale to zero on idle traces: kubeinfer with and without it, Knative's KPA and KEDA's http-add-on with theirs (activators, cold start 20 s) -> bench/results/autoscaler_zero.json
	$(PY) bench/autoscaler_zero.py

bench: bench-runtime bench-frontend bench-operator bench-cache bench-hostile bench-perf-analyzer bench-token-budget bench-pool \
       bench-cold-start bench-autoscaler bench-autoscaler-adversary bench-autoscaler-frontier bench-autoscaler-zero \
       bench-peers ## all benchmarks, one after the other (NOISY=1: --noisy to those that measure)

clean: cluster-down ## remove the venv and build cache
	rm -rf .venv .cache
