#!/usr/bin/env bash
# End-to-end check of llmplane on a real Kubernetes cluster (kind + Docker). NOT run in CI:
# CI has no Docker engine and no network; the operator is tested there against an API emulator
# (tests/integration/test_operator_emulator.py) and every manifest against the real schemas.
#
# Needs: docker, kind (>= 0.23), kubectl, helm 3, and network access to pull images.
# Usage: deploy/kind/e2e.sh            # create cluster, install, check, delete cluster
#        KEEP=1 deploy/kind/e2e.sh     # keep the cluster afterwards
#
# What it checks (no GPU needed: the model is served by llmplane's simulated engine, `sim`):
#   1. the chart installs the CRDs, operator and gateway; LeaderWorkerSet is installed first;
#   2. an OpenModel + Playground become a Service, a LeaderWorkerSet and a <name>-lb Service
#      owned through ownerReferences, and the Playground reaches Available=True (PlaygroundReady);
#   3. the gateway refuses a request without a key (401) and, with a Tenant's key, answers
#      /v1/chat/completions for the model;
#   4. deleting the Playground garbage-collects everything it created.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-llmplane-e2e}
IMAGE=${IMAGE:-ghcr.io/llmplane/llmplane:e2e}
LWS_VERSION=${LWS_VERSION:-v0.6.2}
NS=llmplane-system

cleanup() {
  if [ -z "${KEEP:-}" ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
wait_for() {  # wait_for DESCRIPTION SECONDS COMMAND...
  local what=$1 seconds=$2; shift 2
  for _ in $(seq "$seconds"); do
    if "$@" >/dev/null 2>&1; then echo "ok: $what"; return 0; fi
    sleep 1
  done
  echo "FAILED: $what" >&2
  kubectl -n "$NS" logs deploy/llmplane-operator --tail=100 >&2 || true
  return 1
}

step "cluster and image"
kind create cluster --name "$CLUSTER" --wait 120s
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "LeaderWorkerSet $LWS_VERSION"
kubectl apply --server-side -f "https://github.com/kubernetes-sigs/lws/releases/download/$LWS_VERSION/manifests.yaml"
kubectl -n lws-system rollout status deploy/lws-controller-manager --timeout=180s

step "llmplane chart"
helm install llmplane deploy/helm/llmplane --namespace "$NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set gateway.replicas=1 --wait --timeout 180s
kubectl get crd playgrounds.inference.llmaz.io openmodels.llmaz.io >/dev/null

step "a Playground on the simulated engine"
kubectl apply -f - <<YAML
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata:
  name: tiny
  annotations: {llmaz.io/skip-model-loader: "true"}
spec:
  familyName: sim
  source: {modelHub: {modelID: llmplane/sim-tiny}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {name: tiny, namespace: default}
spec:
  replicas: 1
  modelClaim: {modelName: tiny}
  backendRuntimeConfig:
    backendName: sim
    version: "${IMAGE##*:}"
YAML
# The built-in sim BackendRuntime's image is the llmplane image; point it at the one loaded above.
kubectl patch backendruntime sim --type merge -p "{\"spec\":{\"image\":\"${IMAGE%:*}\"}}"

wait_for "Service created and owned by the Playground" 60 \
  sh -c "kubectl get services.inference.llmaz.io tiny -o jsonpath='{.metadata.ownerReferences[0].kind}' | grep -qx Playground"
wait_for "LeaderWorkerSet created" 60 kubectl get leaderworkerset tiny
wait_for "tiny-lb Service created" 60 kubectl get service tiny-lb
wait_for "Playground Available=True" 300 \
  sh -c "kubectl get playground tiny -o jsonpath='{.status.conditions[?(@.type==\"Available\")].status}' | grep -qx True"
kubectl get playground tiny -o jsonpath='{.status.conditions[?(@.type=="Available")].reason}{"\n"}'

step "through the gateway"
kubectl -n "$NS" port-forward svc/llmplane-gateway 18080:80 >/dev/null 2>&1 &
PF=$!
trap 'kill $PF 2>/dev/null || true; cleanup' EXIT
wait_for "gateway reachable" 30 curl -sf http://127.0.0.1:18080/health
# The gateway listens beyond loopback in its pod: it needs a Tenant's key. Make one in a
# scratch state directory and apply the Tenant (without the scratch store's server fields).
KEYS_DIR=$(mktemp -d)
KEY=$(python -m llmplane.cli keys create e2e --state-dir "$KEYS_DIR" | tail -n 1)
python -m llmplane.cli get tenant e2e -o yaml --state-dir "$KEYS_DIR" \
  | grep -Ev '^  (uid|resourceVersion|generation|creationTimestamp):' | kubectl apply -f -
rm -rf "$KEYS_DIR"
code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18080/v1/models)
[ "$code" = 401 ] || { echo "expected 401 without a key, got $code" >&2; exit 1; }
wait_for "the key accepted" 30 curl -sf -H "Authorization: Bearer $KEY" http://127.0.0.1:18080/v1/models
curl -sf http://127.0.0.1:18080/v1/chat/completions -H 'content-type: application/json' \
  -H "Authorization: Bearer $KEY" \
  -d '{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":8}' | tee /dev/stderr \
  | grep -q '"choices"'
echo "ok: chat completion through the gateway"

step "garbage collection"
kubectl delete playground tiny --wait
wait_for "LeaderWorkerSet deleted with its owner" 60 sh -c "! kubectl get leaderworkerset tiny"
wait_for "Service deleted with its owner" 60 sh -c "! kubectl get services.inference.llmaz.io tiny"
wait_for "tiny-lb deleted with its owner" 60 sh -c "! kubectl get service tiny-lb"

step "all checks passed"
