#!/usr/bin/env bash
# NodeGate end to end on kind, for users with a container engine. Not run by CI here: this machine
# has no Docker engine (CI uses the dev control plane: `make test`).
#
#   hack/kind-e2e.sh            # build, create the cluster, install, roll out, keep the cluster
#   CLEANUP=1 hack/kind-e2e.sh  # ... and delete the cluster at the end
#
# Steps: build NodeGate's image and a sample package image (packages/sysctl-tuning) -> create a kind
# cluster (one control plane, two workers) -> load the images -> install cert-manager -> install the
# chart with cert-manager certificates -> apply the sample NodeGate to the labelled workers -> wait
# until it is Ready and show the nodes' status labels.
#
# Needs: docker (or podman with KIND_EXPERIMENTAL_PROVIDER=podman), kind, kubectl, helm; network
# access to pull the base images, kind's node image and cert-manager's manifest.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=${CLUSTER:-nodegate-e2e}
NAMESPACE=${NAMESPACE:-nodegate-system}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/gate/__init__.py")
IMAGE_REPO=${IMAGE_REPO:-ghcr.io/nodegate/nodegate}
IMAGE_TAG=${IMAGE_TAG:-$VERSION-e2e}
PACKAGE_IMAGE=${PACKAGE_IMAGE:-localhost/nodegate-sysctl-tuning}
CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-v1.16.2}
CERT_MODE=${CERT_MODE:-cert-manager}   # cert-manager | self-managed
CLEANUP=${CLEANUP:-0}

log() { printf '\n==> %s\n' "$*" >&2; }
need() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "error: $tool is required (see the header of $0)" >&2; exit 2; }
  done
}
need docker kind kubectl helm
docker info >/dev/null 2>&1 || { echo "error: no container engine answers (docker info failed)" >&2; exit 2; }

cleanup() {
  if [[ "$CLEANUP" == 1 ]]; then
    log "Deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER"
  fi
}
trap cleanup EXIT

log "Building NodeGate's image $IMAGE_REPO:$IMAGE_TAG"
docker build -t "$IMAGE_REPO:$IMAGE_TAG" "$ROOT"
PACKAGE_VERSION=$(sed -n 's/^version: //p' "$ROOT/packages/sysctl-tuning/package.yaml")
log "Building the sample package image $PACKAGE_IMAGE:$PACKAGE_VERSION"
docker build -t "$PACKAGE_IMAGE:$PACKAGE_VERSION" "$ROOT/packages/sysctl-tuning"

if ! kind get clusters | grep -qx "$CLUSTER"; then
  log "Creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 120s --config - <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
    labels: {nodegate.io/tuning: "true"}
  - role: worker
    labels: {nodegate.io/tuning: "true"}
KIND
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null
kind load docker-image --name "$CLUSTER" "$IMAGE_REPO:$IMAGE_TAG" "$PACKAGE_IMAGE:$PACKAGE_VERSION"

chart_values=(--set "image.repository=$IMAGE_REPO" --set "image.tag=$IMAGE_TAG" --set image.pullPolicy=Never)
if [[ "$CERT_MODE" == cert-manager ]]; then
  log "Installing cert-manager $CERT_MANAGER_VERSION"
  kubectl apply -f "https://github.com/cert-manager/cert-manager/releases/download/$CERT_MANAGER_VERSION/cert-manager.yaml"
  kubectl -n cert-manager wait --for=condition=Available deployment --all --timeout=300s
  chart_values+=(--set certManager.enabled=true)
fi

log "Installing NodeGate (certificates: $CERT_MODE)"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
# Package pods run privileged in NodeGate's namespace.
kubectl label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=privileged --overwrite
helm upgrade --install nodegate "$ROOT/charts/nodegate" --namespace "$NAMESPACE" "${chart_values[@]}" \
  --wait --timeout 5m
kubectl wait --for=condition=established crd/nodegates.nodegate.io crd/deploymentpolicies.nodegate.io
kubectl -n "$NAMESPACE" rollout status deployment/nodegate-webhook --timeout=180s
kubectl -n "$NAMESPACE" rollout status deployment/nodegate-operator --timeout=180s

log "Checking that the webhook refuses a bad spec"
if kubectl apply --dry-run=server -f - <<BAD 2>/tmp/nodegate-e2e-denied; then
apiVersion: nodegate.io/v1alpha1
kind: NodeGate
metadata: {name: e2e-bad}
spec:
  deploymentPolicy: does-not-exist   # passes the CRD schema: only the webhook can refuse it
BAD
  echo "error: the webhook admitted a NodeGate naming a missing DeploymentPolicy" >&2; exit 1
fi
grep -q "denied the request" /tmp/nodegate-e2e-denied && cat /tmp/nodegate-e2e-denied

log "Rolling out the sample NodeGate (sysctl-tuning, 25% of the labelled workers at a time)"
sed "s#image: ghcr.io/example/nodegate-sysctl-tuning#image: $PACKAGE_IMAGE#" \
  "$ROOT/packages/sysctl-tuning/nodegate.yaml" | kubectl apply -f -
kubectl wait --for=condition=Ready nodegate/sysctl-tuning --timeout=600s
kubectl get nodes -L nodegate.io/status.sysctl-tuning
kubectl get nodegate sysctl-tuning

log "NodeGate on kind: done (kubectl context kind-$CLUSTER)"
