# bashtask-operator build and test entry points. `make help` lists them.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO            ?= go
LOCALBIN      := $(CURDIR)/bin
# The control-plane binaries (kube-apiserver, etcd) built by hack/setup-envtest.sh.
KUBEBUILDER_ASSETS := $(LOCALBIN)/k8s
export KUBEBUILDER_ASSETS

GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)

# kube-api-linter checks the API types against the Kubernetes API
# conventions: golangci-lint built with it as a module
# (cmd/golangci-lint-kube-api-linter), at the version hack/tools/go.mod pins.
KUBE_API_LINTER_VERSION := $(shell awk '$$1 == "sigs.k8s.io/kube-api-linter" { print $$2 }' hack/tools/go.mod)
KUBE_API_LINTER := $(LOCALBIN)/golangci-lint-kube-api-linter-$(KUBE_API_LINTER_VERSION)

CONTROLLER_GEN := $(GO) tool controller-gen

# Packages by kind of test: integration packages need a real kube-apiserver,
# e2e packages need the whole local control plane.
INTEGRATION_PKGS := ./test/integration/... ./controllers/... ./operator/...
E2E_PKGS         := ./test/e2e/...
CLUSTER_PKGS     := ./test/cluster/...
UNIT_PKGS         = $(shell $(GO) list ./... | grep -v -e /test/integration -e /test/e2e -e /test/cluster -e /controllers -e /operator)
TEST_FLAGS       ?= -race -count=1
# Go test timeouts sized for a 2-core machine.
UNIT_TIMEOUT        ?= 10m
INTEGRATION_TIMEOUT ?= 15m
E2E_TIMEOUT         ?= 30m
CLUSTER_TIMEOUT     ?= 30m
# Isolation levels the e2e suite runs at, one whole run each: tenant (the
# chart's default, which needs root) and process.
E2E_ISOLATIONS      ?= $(if $(filter 0,$(shell id -u)),tenant process,process)

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: ## Generate code: deepcopy functions and OpenAPI definitions for the API types, agent protocol Go code.
	$(CONTROLLER_GEN) object paths=./api/...
	$(MAKE) generate-openapi
	$(MAKE) generate-proto

# The OpenAPI definitions the output API server (outputapi) serves: those of
# output.bashtask.dev/v1alpha1 and of the apimachinery types they and the
# server's discovery refer to, from k8s.io/kube-openapi's openapi-gen (a
# go.mod tool, so its version is kube-openapi's in go.mod). The definitions
# import kube-openapi, which the api/ packages must not, so they live in
# outputapi/openapi; the types' OpenAPIModelName methods, which import
# nothing, are generated next to the types (+k8s:openapi-model-package).
# The apimachinery packages are read only: their known API rule violations
# are reported, and one in output.bashtask.dev's types fails the target.
OPENAPI_GEN       := $(GO) tool openapi-gen
OPENAPI_OUT       := outputapi/openapi
OPENAPI_BASE_PKGS := k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version

.PHONY: generate-openapi
generate-openapi: ## Generate the output API's OpenAPI definitions (go tool openapi-gen).
	@mkdir -p $(LOCALBIN)
	$(OPENAPI_GEN) --output-dir $(OPENAPI_OUT) --output-pkg github.com/bashtask/bashtask-operator/$(OPENAPI_OUT) \
	  --output-file zz_generated.openapi.go --output-model-name-file zz_generated.model_name.go --go-header-file /dev/null \
	  $(addprefix --readonly-pkg=,$(OPENAPI_BASE_PKGS)) --report-filename $(LOCALBIN)/openapi-violations.txt \
	  $(OPENAPI_BASE_PKGS) ./api/output/v1alpha1
	@if grep -v -e ',k8s.io/apimachinery/' $(LOCALBIN)/openapi-violations.txt >&2; then \
	  echo "generate-openapi: API rule violations in output.bashtask.dev's types (above)" >&2; exit 1; fi

# The agent protocol's Go code, from api/agent/v1/agent.proto. protoc comes
# from Debian's protobuf-compiler; the Go plugins are go.mod tools. The
# generated header names the protoc version, so it is pinned to the version
# the committed files were made with (Debian bookworm's) and `make verify`
# stays stable when a different protoc produced the same code.
PROTOC_VERSION := 3.21.12
PROTO_DIR      := api/agent/v1

.PHONY: generate-proto
generate-proto: ## Generate the agent protocol's Go code (protoc + go tool protoc-gen-go[-grpc]).
	@command -v protoc >/dev/null || { echo "generate-proto: protoc missing; apt-get install protobuf-compiler" >&2; exit 1; }
	@v="$$(protoc --version | awk '{print $$2}')"; [[ "$$v" == "$(PROTOC_VERSION)" ]] || \
	  echo "generate-proto: warning: protoc $$v, the committed files were generated with $(PROTOC_VERSION)" >&2
	$(GO) build -o $(LOCALBIN)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(LOCALBIN)/protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc
	protoc --plugin=protoc-gen-go=$(LOCALBIN)/protoc-gen-go --plugin=protoc-gen-go-grpc=$(LOCALBIN)/protoc-gen-go-grpc \
	  -I $(PROTO_DIR) --go_out=$(PROTO_DIR) --go_opt=paths=source_relative \
	  --go-grpc_out=$(PROTO_DIR) --go-grpc_opt=paths=source_relative $(PROTO_DIR)/agent.proto $(PROTO_DIR)/fence.proto $(PROTO_DIR)/workspace.proto $(PROTO_DIR)/snapshot.proto $(PROTO_DIR)/stdin.proto $(PROTO_DIR)/image.proto $(PROTO_DIR)/portforward.proto $(PROTO_DIR)/terminal.proto
	sed -i -e 's|^// \tprotoc  *v.*$$|// \tprotoc        v$(PROTOC_VERSION)|' \
	  -e 's|^// - protoc  *v.*$$|// - protoc             v$(PROTOC_VERSION)|' $(PROTO_DIR)/*.pb.go

.PHONY: manifests
manifests: ## Generate the CRD (config/crd/bases) and RBAC (config/rbac) from markers; copy them and the admission policy into the chart.
	$(CONTROLLER_GEN) crd rbac:roleName=bashtask-controller paths=./... \
	  output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	cp config/crd/bases/*.yaml charts/bashtask/crds/
	cp config/rbac/role.yaml charts/bashtask/files/controller-role.yaml
	cp config/admission/finalizer-policy.yaml charts/bashtask/files/finalizer-policy.yaml
	cp config/admission/warning-policy.yaml charts/bashtask/files/warning-policy.yaml

.PHONY: fmt
fmt: ## Format the Go code.
	$(GO) fmt ./...

.PHONY: vet
vet: ## Run go vet.
	$(GO) vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) $(KUBE_API_LINTER) ## Run golangci-lint with .golangci.yml, then kube-api-linter on ./api/... with .golangci-kal.yml.
	$(GOLANGCI_LINT) run ./...
	$(KUBE_API_LINTER) run --config .golangci-kal.yml ./api/...

.PHONY: verify
verify: ## Regenerate everything and fail on any difference from the commit; then lint.
	$(MAKE) generate manifests
	@if [[ -n "$$(git status --porcelain -- api config $(OPENAPI_OUT))" ]]; then \
	  echo "verify: generated files are out of date; run 'make generate manifests' and commit:" >&2; \
	  git status --porcelain -- api config $(OPENAPI_OUT) >&2; git diff --stat -- api config $(OPENAPI_OUT) >&2; exit 1; \
	fi
	@if [[ -n "$$(git status --porcelain -- charts/bashtask/crds charts/bashtask/files)" ]]; then \
	  echo "verify: the chart's CRDs or RBAC differ from config/; run 'make manifests' and commit" >&2; exit 1; fi
	$(MAKE) helm-lint
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "verify: gofmt needed on:" >&2; gofmt -l $$(git ls-files '*.go') >&2; exit 1; }
	$(MAKE) vet lint

##@ Demo

.PHONY: demo
demo: ## Start a local cluster, run every example in examples/, check the outcomes, stop.
	hack/demo.sh

##@ Build

.PHONY: build
build: ## Build every package, and every binary into bin/.
	$(GO) build ./...
	$(MAKE) -s binaries

# bashtask-shim is built static, as in the images: it starts once per task
# at the agent's tenant level, and a static binary skips the dynamic loader
# and the C library's start.
.PHONY: binaries
binaries: ## Build every binary into bin/.
	$(GO) build -o $(LOCALBIN)/ $$($(GO) list ./cmd/... | grep -v '/cmd/bashtask-shim$$')
	CGO_ENABLED=0 $(GO) build -o $(LOCALBIN)/bashtask-shim ./cmd/bashtask-shim

##@ Test

.PHONY: setup-s3
setup-s3: ## Build versitygw (S3 server for tests) from the Go module proxy into bin/ (once).
	hack/setup-s3.sh >/dev/null

.PHONY: envtest
envtest: ## Build kube-apiserver, etcd and kubectl from the Go module proxy into bin/k8s (once).
	hack/setup-envtest.sh >/dev/null

.PHONY: test
test: test-unit test-integration test-e2e test-chaos test-cluster ## Run unit, integration (real API server), e2e, the short fault run, then the one-node cluster tests.

.PHONY: test-unit
test-unit: test-packages ## Unit tests (no control plane), with the race detector.
	$(GO) test $(TEST_FLAGS) -timeout $(UNIT_TIMEOUT) $(UNIT_PKGS)

# bash-static and busybox-static (Debian), the test images' files
# (docs/images.md); installed when missing.
.PHONY: test-packages
test-packages: ## Install bash-static and busybox-static (Debian) for the image root tests, when missing.
	hack/test-packages.sh

.PHONY: test-integration
test-integration: envtest setup-s3 ## Integration tests against a real kube-apiserver and etcd (envtest), and the agent against versitygw.
	$(GO) test $(TEST_FLAGS) -timeout $(INTEGRATION_TIMEOUT) $(INTEGRATION_PKGS)

.PHONY: test-e2e
test-e2e: envtest setup-s3 build terminal mcp-clients ## End-to-end tests: bashtask-local with the controller, two agents and S3, as processes, at each of E2E_ISOLATIONS.
	@set -e; for level in $(E2E_ISOLATIONS); do \
		echo "test-e2e: agents at isolation $$level"; \
		E2E_ISOLATION=$$level $(GO) test $(TEST_FLAGS) -timeout $(E2E_TIMEOUT) $(E2E_PKGS); \
	done

# The tenant-level examples and a workspace session with every temporary
# directory (the rig's cluster, the agents' work roots) under a 0700 parent
# outside /tmp: under /tmp a task's private /tmp stands in for the way to
# its working directory, and a work root that task UIDs cannot reach would
# pass unseen (docs/development.md). .ci/run runs it after `make test`.
.PHONY: test-e2e-private-parent
test-e2e-private-parent: envtest setup-s3 build
	@set -e; dir=$$(mktemp -d /var/tmp/bashtask-private-parent-XXXXXX); trap 'rm -rf "$$dir"' EXIT; \
	mkdir -m 0700 "$$dir/home"; mkdir -p "$$dir/home/src/tmp"; \
	echo "test-e2e-private-parent: TMPDIR=$$dir/home/src/tmp, $$dir/home is 0700"; \
	TMPDIR="$$dir/home/src/tmp" E2E_ISOLATION=tenant $(GO) test $(TEST_FLAGS) -timeout $(E2E_TIMEOUT) \
		-run '^(TestExamples|TestWorkspaceSession|TestCopyRoundTrip|TestImageWorkspaceTenantRules)$$' ./test/e2e/

# tmux is the real terminal of the interactive tests (`kubectl bashtask
# shell`); it comes from Debian when missing.
.PHONY: terminal
terminal: ## Install tmux (Debian) for the terminal tests, when it is missing.
	@command -v tmux >/dev/null || { echo "terminal: installing tmux from Debian"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; }

.PHONY: mcp-clients
mcp-clients: ## Install the MCP clients of the e2e tests (TypeScript SDK, Inspector CLI) from npm into test/e2e/mcpclients, when missing.
	hack/mcp-clients.sh

.PHONY: test-cluster
test-cluster: build tools ## The Helm chart on a real one-node cluster (kubelet, containerd, runc; images built here); needs root.
	hack/node-packages.sh
	hack/setup-envtest.sh --node >/dev/null
	$(GO) test $(TEST_FLAGS) -timeout $(CLUSTER_TIMEOUT) $(CLUSTER_PKGS)

# The chaos run (test/chaos, docs/chaos.md): a local cluster of processes
# under random faults, with invariants checked from independent evidence.
# The seed is printed first; CHAOS_SEED replays a run, CHAOS_DURATION=30m
# is the long profile.
.PHONY: test-chaos
test-chaos: envtest setup-s3 build ## Randomized faults on a local cluster (two controllers, five agents, two of them at the tenant level, S3); prints the seed, then the invariant table.
	@$(GO) run ./test/chaos

##@ One-node cluster

.PHONY: cluster-up
cluster-up: ## Start a one-node cluster on this machine with the operator installed from the chart (root; INSTALL=0 skips the install).
	hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the one-node cluster and undo its changes to the host.
	hack/cluster.sh down

# The packaging tests (test/integration/packaging) run helm, kustomize and
# kubeconform from bin/.
test-integration: tools

##@ Packaging

# Images: `make docker-build` needs a container engine (docker or podman).
CONTAINER_TOOL ?= docker
IMG_REGISTRY   ?= ghcr.io/bashtask
IMG_TAG        ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

# Tools built from hack/tools (rules in the Tools section); defined before
# the rules that name them as prerequisites.
TOOLS_MOD   := hack/tools/go.mod
HELM        := $(LOCALBIN)/helm
KUSTOMIZE   := $(LOCALBIN)/kustomize
KUBECONFORM := $(LOCALBIN)/kubeconform

.PHONY: docker-build
docker-build: ## Build the controller, agent, task and MCP server images (Dockerfile targets) with version labels.
	for target in controller agent task mcp; do \
	  $(CONTAINER_TOOL) build --target "$$target" \
	    --build-arg VERSION=$(IMG_TAG) --build-arg REVISION="$$(git rev-parse HEAD)" \
	    --build-arg CREATED="$$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
	    -t $(IMG_REGISTRY)/bashtask-$$target:$(IMG_TAG) . ; \
	done

# `make images` needs no container engine: it builds the same images, plus
# a pod sandbox (pause) image and the Task image (bashtask-task, the
# chart's default image of tasks), as docker-archive files in bin/images
# for `ctr -n k8s.io images import` (hack/images; docs/development.md).
# The agent's and the Task image's Debian trees are made with debootstrap,
# as root, once, and cached in bin/images/cache.
.PHONY: images
images: ## Build the controller, agent, pause and task images as archives for containerd, without a container engine (root for the first build).
	$(GO) run ./hack/images -out $(LOCALBIN)/images -tag $(IMG_TAG) \
	  -revision "$$(git rev-parse HEAD 2>/dev/null || echo unknown)"

.PHONY: helm-lint
helm-lint: $(HELM) ## Lint the Helm chart with its default values and the cert-manager variant.
	$(HELM) lint --strict charts/bashtask
	$(HELM) lint --strict charts/bashtask --set certificates.source=cert-manager --set serviceMonitor.enabled=true

.PHONY: test-packaging
test-packaging: envtest tools ## Render the chart and config/default, validate them and dry-run them on a real API server.
	$(GO) test -count=1 -timeout $(INTEGRATION_TIMEOUT) ./test/integration/packaging/...

##@ Benchmarks

# Every benchmark is a phase of one harness, hack/bench (docs/performance.md):
# executor, snapshot, images, workspace, apiserver, resume, output, session, system and scale,
# chosen with -phases; `go run ./hack/bench -help` lists every flag. Each phase
# prints its table, and the run writes one JSON file with a section per phase.
# The output, session and system phases share one local cluster, started once.
BENCH := $(GO) run ./hack/bench

.PHONY: bench-snapshot
bench-snapshot: ## Workspace snapshot and restore of about 1 GiB of mixed files against tar | zstd and zstd -d | tar -x.
	mkdir -p _output
	$(BENCH) -phases=snapshot -json _output/bench-snapshot.json -snapshot-args='$(BENCH_SNAPSHOT_ARGS)'

# The resume of a Suspended workspace of 100 MiB until its first task
# starts (the resume phase; docs/performance.md), on a local cluster of
# its own at the tenant level with a versitygw S3 bucket: root only.
# BENCH_RESUME_ARGS passes flags, e.g. BENCH_RESUME_ARGS='-rounds=20 -modes=task'.
BENCH_RESUME_ARGS ?=

.PHONY: bench-resume
bench-resume: build envtest setup-s3 ## Resume of a Suspended 100 MiB workspace until its first task starts, p50/p90/max over rounds (root).
	mkdir -p _output
	$(BENCH) -phases=resume -json _output/bench-resume.json -resume-args='$(BENCH_RESUME_ARGS)'

# The fork of a workspace of 100 MiB in 2,000 files on its node until the
# copies are Ready, one copy and 8 at once, against cp -a of the same tree
# (the fork phase; docs/workspaces.md, "Forking a workspace"), on the shared
# local cluster at the tenant level: root only. BENCH_FORK_ARGS passes
# flags, e.g. BENCH_FORK_ARGS='-rounds=20 -count=16'.
BENCH_FORK_ARGS ?=

.PHONY: bench-fork
bench-fork: build envtest ## Fork of a 100 MiB workspace on its node until Ready (1 and 8 copies) against cp -a, p50/p90 over rounds (root).
	mkdir -p _output
	$(BENCH) -phases=fork -json _output/bench-fork.json -fork-args='$(BENCH_FORK_ARGS)'

# One command of a session (the session phase; docs/performance.md): the
# plugin binary's `run -w W -- true` and the Go client's Run of `true` in a
# workspace, one at a time, on a local cluster (at the tenant level as root,
# as workspaces need). BENCH_SESSION_ARGS passes flags, e.g.
# BENCH_SESSION_ARGS='-runs=100'.
.PHONY: bench-session
bench-session: build envtest ## Wall time of one command through kubectl-bashtask run and the Go client's Run, with create→terminal of the same runs (root).
	mkdir -p _output
	$(BENCH) -phases=session -json _output/bench-session.json -session-args='$(BENCH_SESSION_ARGS)'

# Port-forward into a workspace (the portforward phase; docs/portforward.md):
# 1 GiB through one forwarded connection and small HTTP requests, through
# the Go client's PortForward on a local cluster (tenant level, root).
.PHONY: bench-portforward
bench-portforward: build envtest ## Throughput of 1 GiB and small-HTTP-request rate through a port-forward into a workspace (root).
	mkdir -p _output
	$(BENCH) -phases=portforward -json _output/bench-portforward.json -portforward-args='$(BENCH_PORTFORWARD_ARGS)'

# The terminal and port-forward side by side with kubectl exec -it and
# kubectl port-forward to a pod (the kubectl phase; docs/performance.md), on
# the one-node cluster that `make cluster-up` started (root).
# BENCH_CLUSTER_INTERACTIVE_ARGS passes flags, e.g. '-keys=1000 -bytes=268435456'.
BENCH_CLUSTER_INTERACTIVE_ARGS ?=

.PHONY: bench-cluster-interactive
bench-cluster-interactive: ## Echo p50/p99 and port-forward throughput and requests/s against kubectl exec -it and port-forward, on the running one-node cluster (root).
	mkdir -p _output
	$(BENCH) -phases=kubectl -json _output/bench-cluster-interactive.json -kubectl-args='$(BENCH_CLUSTER_INTERACTIVE_ARGS)'

# Keystroke echo through the API (the terminal phase; docs/terminal.md):
# a byte written to a task's terminal through bashtasks/attach and its
# echo read back, one at a time, on a local cluster.
# BENCH_TERMINAL_ARGS passes flags, e.g. BENCH_TERMINAL_ARGS='-keys=2000'.
BENCH_TERMINAL_ARGS ?=

.PHONY: bench-terminal
bench-terminal: build envtest ## Keystroke echo through bashtasks/attach on the local cluster: p50 and p99 (targets 10 ms, 50 ms).
	mkdir -p _output
	$(BENCH) -phases=terminal -json _output/bench-terminal.json -terminal-args='$(BENCH_TERMINAL_ARGS)'

# One command through `kubectl bashtask mcp`'s run tool over stdio against
# the plugin's `run -w W -- true` (the mcp phase; docs/performance.md), on a
# local cluster. BENCH_MCP_ARGS passes flags, e.g. BENCH_MCP_ARGS='-runs=100'.
.PHONY: bench-mcp
bench-mcp: build envtest ## Request to result of an MCP run of true over stdio against kubectl-bashtask run of the same (root).
	mkdir -p _output
	$(BENCH) -phases=mcp -json _output/bench-mcp.json -mcp-args='$(BENCH_MCP_ARGS)'

# The node's image store against `crane export | tar -x` (the images phase;
# docs/performance.md): first use, a second pull and the disk, on the task
# image of bin/images/bashtask-task.tar (`go run ./hack/images -only task`) or a
# generated one of 300 MiB; root only. BENCH_IMAGES_ARGS passes flags, e.g.
# BENCH_IMAGES_ARGS='-rounds=5 -mib=500'.
BENCH_IMAGES_ARGS ?=

.PHONY: bench-images
bench-images: ## First use, second pull and disk of an image in the node's image store against crane export | tar -x (root).
	mkdir -p _output
	$(BENCH) -phases=images -json _output/bench-images.json -images-args='$(BENCH_IMAGES_ARGS)'

# BENCH_EXECUTOR_ARGS passes flags to the executor phase, e.g.
# BENCH_EXECUTOR_ARGS='-n=50 -stream-rounds=2'; BENCH_SNAPSHOT_ARGS to the
# snapshot phase, e.g. BENCH_SNAPSHOT_ARGS='-rounds=1 -copies=1'.
BENCH_EXECUTOR_ARGS ?=
BENCH_SNAPSHOT_ARGS ?=

.PHONY: bench-executor
bench-executor: ## Executor overhead, output throughput and memory, printed as a table.
	mkdir -p _output
	$(BENCH) -phases=executor -json _output/bench-executor.json -executor-args='$(BENCH_EXECUTOR_ARGS)'

# `make bench` runs the executor phase, the snapshot phase, the resume phase
# (as root: a local cluster of its own at the tenant level), then the output
# API phase (a follower's latency and throughput, the controller's and the
# agent's RSS under 1000 followers), the session phase (one command of a
# session through the plugin binary and the Go client) and the whole system,
# all three on one local cluster (docs/performance.md); the system's table
# takes in the executor's, the output API's, the resume's and the session's
# figures. BENCH_SKIP_EXECUTOR=1, BENCH_SKIP_OUTPUT=1, BENCH_SKIP_SNAPSHOT=1,
# BENCH_SKIP_RESUME=1, BENCH_SKIP_SESSION=1, BENCH_SKIP_TERMINAL=1 (the
# keystroke echo through bashtasks/attach) and BENCH_SKIP_MCP=1 skip those phases for quick
# iterations (BENCH_PHASES=... names the phases outright); BENCH_ARGS passes
# flags to hack/bench, e.g. BENCH_ARGS='-controller-arg=--workers=16
# -rss-tasks=0' (the system phase's flags and the cluster's),
# BENCH_OUTPUT_ARGS to the output phase, e.g. BENCH_OUTPUT_ARGS='-bytes=0',
# and BENCH_SESSION_ARGS to the session phase, e.g. BENCH_SESSION_ARGS='-runs=100'.
BENCH_SKIP_EXECUTOR ?=
BENCH_SKIP_OUTPUT   ?=
BENCH_SKIP_SESSION  ?=
BENCH_SKIP_TERMINAL ?=
BENCH_SKIP_MCP      ?=
BENCH_ARGS          ?=
BENCH_OUTPUT_ARGS   ?=
BENCH_SESSION_ARGS  ?=
BENCH_MCP_ARGS      ?=
BENCH_EXECUTOR      := $(if $(filter 1 true yes,$(BENCH_SKIP_EXECUTOR)),,1)
BENCH_OUTPUT        := $(if $(filter 1 true yes,$(BENCH_SKIP_OUTPUT)),,1)
BENCH_SESSION       := $(if $(filter 1 true yes,$(BENCH_SKIP_SESSION)),,1)
BENCH_TERMINAL      := $(if $(filter 1 true yes,$(BENCH_SKIP_TERMINAL)),,1)
BENCH_MCP           := $(if $(filter 1 true yes,$(BENCH_SKIP_MCP)),,1)
BENCH_SNAPSHOT      := $(if $(filter 1 true yes,$(BENCH_SKIP_SNAPSHOT)),,1)
# The resume bench needs root (workspaces need the tenant level).
BENCH_RESUME        := $(if $(filter 1 true yes,$(BENCH_SKIP_RESUME)),,$(if $(filter 0,$(shell id -u)),1))
# The egress bench needs root too (network namespaces, nftables).
BENCH_EGRESS        := $(if $(filter 1 true yes,$(BENCH_SKIP_EGRESS)),,$(if $(filter 0,$(shell id -u)),1))
bench_empty         :=
bench_space         := $(bench_empty) $(bench_empty)
BENCH_PHASES        ?= $(subst $(bench_space),$(comma),$(strip $(if $(BENCH_EXECUTOR),executor) $(if $(BENCH_EGRESS),egress) $(if $(BENCH_OUTPUT),output) \
                       $(if $(BENCH_SNAPSHOT),snapshot) $(if $(BENCH_RESUME),resume) $(if $(BENCH_SESSION),session) $(if $(BENCH_TERMINAL),terminal) $(if $(BENCH_MCP),mcp) system))
comma               := ,

# The controller's Go benchmarks: the costs per placement decision that
# the scale curve depends on (docs/scaling.md).
.PHONY: bench-controllers
bench-controllers: envtest ## Go benchmarks of the controller's placement counts (workspaces per node, an owner's running tasks).
	$(GO) test ./controllers -run '^$$' -bench . -benchmem -count=1

.PHONY: bench
bench: build envtest bench-controllers $(if $(BENCH_RESUME),setup-s3) ## Latency, throughput, writes per task, raw API limit and controller RSS on the local cluster (+ the executor, output API, snapshot, resume and session phases); writes _output/bench.json.
	mkdir -p _output
	$(BENCH) -phases=$(BENCH_PHASES) -json _output/bench.json -executor-args='$(BENCH_EXECUTOR_ARGS)' \
	  -snapshot-args='$(BENCH_SNAPSHOT_ARGS)' -output-args='$(BENCH_OUTPUT_ARGS)' -resume-args='$(BENCH_RESUME_ARGS)' -terminal-args='$(BENCH_TERMINAL_ARGS)' \
	  -session-args='$(BENCH_SESSION_ARGS)' -mcp-args='$(BENCH_MCP_ARGS)' $(BENCH_ARGS)

# The scale curve (the scale phase; docs/scaling.md): 2 and 10 real agents
# and 100 simulated ones, 1k and 10k tasks at a steady rate, 10k
# workspaces, each point on a cluster of its own, in about 15 minutes;
# one row per point in _output/bench-scale.json. The 100k-task point:
# BENCH_SCALE_ARGS='-large' (about half an hour more). One point:
# BENCH_SCALE_ARGS='-points=100sim:1000'.
BENCH_SCALE_ARGS ?=

.PHONY: bench-scale
bench-scale: build envtest ## Scale curve: 2, 10 real and 100 simulated agents, 1k and 10k tasks, 10k workspaces (-large: 100k tasks); one row per point (docs/scaling.md).
	mkdir -p _output
	$(BENCH) -phases=scale -json _output/bench-scale.json -scale-args='$(BENCH_SCALE_ARGS)'

# kube-apiserver CPU per task for variants of the CRD's validation rules and
# of the status writes (the apiserver phase; docs/performance.md), e.g.
# BENCH_APISERVER_ARGS='-variants=base,nocel,base/nocond'.
BENCH_APISERVER_ARGS ?=

.PHONY: bench-apiserver
bench-apiserver: envtest ## kube-apiserver CPU per task for variants of the CRD's rules and of the status writes, in alternating windows.
	mkdir -p _output
	$(BENCH) -phases=apiserver -json _output/bench-apiserver.json -apiserver-args='$(BENCH_APISERVER_ARGS)'

# What idle workspaces cost one agent (the workspace phase;
# docs/performance.md): 1000 of them by default, with the agent's default
# 10Gi file system each. Needs root, loop devices and mkfs.ext4; a few
# minutes, so not part of `make bench`. BENCH_WORKSPACE_ARGS passes flags,
# e.g. BENCH_WORKSPACE_ARGS='-n 200 -networks None,Egress'.
BENCH_WORKSPACE_ARGS ?=

.PHONY: bench-workspaces
bench-workspaces: ## Memory, kernel memory, disk, loop devices and create/delete latency of 1000 idle workspaces on one agent, then 200 in one image (root).
	mkdir -p _output
	$(BENCH) -phases=workspace -json _output/bench-workspace.json -workspace-args='$(BENCH_WORKSPACE_ARGS)'

##@ Tools

.PHONY: tools
tools: $(HELM) $(KUSTOMIZE) $(KUBECONFORM) ## Build helm, kustomize and kubeconform (pinned in hack/tools/go.mod) into bin/.

# helm is stamped with its version and the Kubernetes minor version of its
# client libraries, as its own release build does (otherwise it assumes 1.20).
$(HELM): $(TOOLS_MOD)
	mkdir -p $(LOCALBIN)
	cd hack/tools && v="$$($(GO) list -m -f '{{.Version}}' helm.sh/helm/v3)" && \
	  k="$$($(GO) list -m -f '{{.Version}}' k8s.io/client-go)" && minor="$${k#v0.}" && minor="$${minor%%.*}" && \
	  $(GO) build -trimpath -o $@ -ldflags "-X helm.sh/helm/v3/internal/version.version=$$v \
	    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$$minor \
	    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$$minor" \
	    helm.sh/helm/v3/cmd/helm

$(KUSTOMIZE): $(TOOLS_MOD)
	mkdir -p $(LOCALBIN)
	cd hack/tools && v="$$($(GO) list -m -f '{{.Version}}' sigs.k8s.io/kustomize/kustomize/v5)" && \
	  $(GO) build -trimpath -o $@ -ldflags "-X sigs.k8s.io/kustomize/api/provenance.version=$$v" sigs.k8s.io/kustomize/kustomize/v5

$(KUBECONFORM): $(TOOLS_MOD)
	mkdir -p $(LOCALBIN)
	cd hack/tools && $(GO) build -trimpath -o $@ github.com/yannh/kubeconform/cmd/kubeconform

$(GOLANGCI_LINT):
	mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv -f $(LOCALBIN)/golangci-lint $@

$(KUBE_API_LINTER): $(TOOLS_MOD)
	mkdir -p $(LOCALBIN)
	cd hack/tools && $(GO) build -trimpath -o $@ sigs.k8s.io/kube-api-linter/cmd/golangci-lint-kube-api-linter
