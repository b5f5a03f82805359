# syntax=docker/dockerfile:1
#
# Images of the operator, one target each:
#
#   docker build --target controller -t bashtask-controller .
#   docker build --target agent      -t bashtask-agent .
#   docker build --target task       -t bashtask-task .
#   docker build --target mcp        -t bashtask-mcp .
#
# `make docker-build` builds the four with the version metadata below.

ARG GO_VERSION=1.26.8
ARG BUILDER_IMAGE=golang:${GO_VERSION}-bookworm
# The controller needs nothing but its static binary.
ARG CONTROLLER_BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot
# The agent runs users' shell commands, so its image carries bash and the
# usual command-line tools.
ARG AGENT_BASE_IMAGE=debian:bookworm-slim

FROM --platform=$BUILDPLATFORM ${BUILDER_IMAGE} AS build
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY api/ api/
COPY client/ client/
COPY cmd/ cmd/
COPY agentpool/ agentpool/
COPY controllers/ controllers/
COPY executor/ executor/
COPY internal/ internal/
COPY mcpserver/ mcpserver/
COPY operator/ operator/
COPY outputapi/ outputapi/
# Static binaries (no cgo): the controller's base has no C library.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/bashtask-controller ./cmd/bashtask-agent ./cmd/bashtask-shim ./cmd/kubectl-bashtask

FROM ${CONTROLLER_BASE_IMAGE} AS controller
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="bashtask-controller" \
      org.opencontainers.image.description="Reconciles BashTask resources through the node agents" \
      org.opencontainers.image.source="https://github.com/bashtask/bashtask-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
COPY --from=build /out/bashtask-controller /bashtask-controller
USER 65532:65532
ENTRYPOINT ["/bashtask-controller"]

FROM ${AGENT_BASE_IMAGE} AS agent
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="bashtask-agent" \
      org.opencontainers.image.description="Node-local executor agent for BashTask resources" \
      org.opencontainers.image.source="https://github.com/bashtask/bashtask-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
# Tools tasks commonly expect. ca-certificates is also the agent's own: it
# uploads output to object storage over HTTPS; e2fsprogs (mkfs.ext4) makes
# the file systems of the tasks' working directories (--task-disk-size).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      bash coreutils findutils grep sed gawk diffutils procps util-linux \
      tar gzip xz-utils bzip2 unzip zip ca-certificates curl jq git openssh-client e2fsprogs \
 && rm -rf /var/lib/apt/lists/*
# The unprivileged account tasks run as (the chart's agent.runAsUser).
RUN groupadd --gid 10001 bashtask \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/bashtask --shell /bin/bash bashtask
COPY --from=build /out/bashtask-agent /usr/local/bin/bashtask-agent
# Each task's shim at the tenant isolation level: the agent starts it from
# beside its own binary (docs/agent.md, --shim-path).
COPY --from=build /out/bashtask-shim /usr/local/bin/bashtask-shim
# The agent itself runs as root: it creates the tasks' cgroups, starts each
# task as the unprivileged user above and must be able to signal every
# process a task started. docs/install.md explains each privilege.
ENTRYPOINT ["/usr/local/bin/bashtask-agent"]
CMD ["serve"]

# The default image of tasks (the chart's agent.images.defaultImage): what
# a task that names no image runs in. The same packages as the Task image
# `make images` builds with debootstrap (internal/rig/nodeimages,
# taskPackages; its tests compare the two lists), on bookworm-slim; no
# user, no entrypoint: the agent runs `bash -c` in it as the task's own
# user (docs/images.md).
FROM ${AGENT_BASE_IMAGE} AS task
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="bashtask-task" \
      org.opencontainers.image.description="Debian bookworm with bash, git, curl and python3, for BashTasks" \
      org.opencontainers.image.source="https://github.com/bashtask/bashtask-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      bash coreutils findutils grep sed gawk diffutils procps less file \
      tar gzip xz-utils bzip2 unzip zip ca-certificates curl jq git openssh-client \
      python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*
CMD ["/bin/bash"]

# The MCP server over Streamable HTTP (`kubectl-bashtask mcp --http`, the
# chart's mcp values; docs/mcp.md): the plugin's static binary and nothing
# else. It holds no credentials of its own: each request's bearer token.
FROM ${CONTROLLER_BASE_IMAGE} AS mcp
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="bashtask-mcp" \
      org.opencontainers.image.description="Model Context Protocol server over BashWorkspaces (kubectl-bashtask mcp)" \
      org.opencontainers.image.source="https://github.com/bashtask/bashtask-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
COPY --from=build /out/kubectl-bashtask /kubectl-bashtask
USER 65532:65532
ENTRYPOINT ["/kubectl-bashtask"]
