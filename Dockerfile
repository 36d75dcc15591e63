# syntax=docker/dockerfile:1.7
# NodeGate's one image: `nodegate webhook serve`, `nodegate operator run`, the chart's pre-delete hook
# (`nodegate pre-delete`) and the agent the operator runs in package pods (`nodegate agent ...`).
#
#   docker build -t ghcr.io/nodegate/nodegate:0.1.0 .
#
# Users: the webhook, the operator and the hook run as uid 65532, non-root, on a read-only root
# filesystem: the chart sets that in their securityContext. The image's default user stays root for
# one reason: the agent in package pods chroots into the host (privileged, hostPID, the host's / at
# /host), and the operator's stage Jobs set `privileged` without a runAsUser, so they run as the
# image's user. Nothing else in NodeGate runs privileged or as root. The operator starts the agent as
# `/opt/nodegate/bin/python -I -u -B -m gate ...`, not through the entrypoint: isolated mode ignores the
# PYTHON* variables below (and any a gate's env sets), so -u and -B stand in for the first two.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first: they change less often than the code and keep their own layer.
COPY pyproject.toml README.md ./
RUN python -m venv /opt/nodegate \
 && mkdir gate && touch gate/__init__.py \
 && /opt/nodegate/bin/pip install --quiet . \
 && /opt/nodegate/bin/pip uninstall --quiet --yes nodegate \
 # setuptools' build/ of the placeholder must go: COPY keeps the sources' older mtimes, so the next
 # build would skip them as up to date and install the empty gate/__init__.py again
 && rm -rf build gate nodegate.egg-info
COPY gate ./gate
RUN /opt/nodegate/bin/pip install --quiet --no-deps . \
 # What the image does not run goes: the `kubernetes` package (about 125 MB of generated clients;
 # in a pod NodeGate reads its ServiceAccount itself, gate/kube/config.py, and only a kubeconfig
 # needs that package's loader) with the packages only it pulls in, and pip and setuptools.
 && /opt/nodegate/bin/pip uninstall --quiet --yes kubernetes aiohttp-retry durationpy oauthlib python-dateutil \
      six requests requests-oauthlib urllib3 websocket-client charset-normalizer certifi \
 # bytecode compiled now: at run time the root filesystem is read-only
 && /opt/nodegate/bin/python -m compileall -q /opt/nodegate/lib \
 && /opt/nodegate/bin/nodegate version --client \
 # how the operator starts the agent (gate.controller.pods.AGENT_COMMAND): isolated mode still finds gate
 && /opt/nodegate/bin/python -I -u -B -m gate version --client \
 # every module the image runs imports without what was removed
 && /opt/nodegate/bin/python -m gate.kube.imagecheck \
 && /opt/nodegate/bin/python -m pip uninstall --quiet --yes pip setuptools

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="nodegate" \
      org.opencontainers.image.description="NodeGate: host-layer packages for Kubernetes fleets (webhook, operator, agent)" \
      org.opencontainers.image.source="https://github.com/nodegate/nodegate" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 nodegate \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin nodegate
COPY --from=build /opt/nodegate /opt/nodegate
ENV PATH=/opt/nodegate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["nodegate"]
CMD ["--help"]
