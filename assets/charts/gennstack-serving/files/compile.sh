#!/bin/bash
# Compiles a model for Neuron by starting the exact vLLM server the serving pods run (same
# arguments, so the artifacts match what serving loads): with NEURON_COMPILED_ARTIFACTS pointing
# at an empty directory, vLLM's Neuron worker compiles and saves there. Once the server answers
# /health the artifacts are complete; the server is stopped and the upload container takes over.
#   env: NEURON_COMPILED_ARTIFACTS, VLLM_ARGS (JSON list of arguments after `vllm serve`)
set -euo pipefail
if [ -f /work/skip ]; then
  echo "already compiled: nothing to do"
  exit 0
fi
rm -rf "$NEURON_COMPILED_ARTIFACTS"   # never upload a half-written set from an earlier attempt
mkdir -p "$NEURON_COMPILED_ARTIFACTS"
python3 /scripts/vllm_serve.py 127.0.0.1 8000 &
server=$!
started=$(date +%s)
until curl -sf http://127.0.0.1:8000/health >/dev/null; do
  if ! kill -0 "$server" 2>/dev/null; then
    wait "$server" || true
    echo "vLLM exited before it was healthy: compile failed" >&2
    exit 1
  fi
  sleep 15
done
echo "compiled and loaded in $(( $(date +%s) - started )) s"
kill -TERM "$server"
wait "$server" || true
# The compile ran as root; the upload container does not: every file readable, every folder listable.
chmod -R a+rX "$NEURON_COMPILED_ARTIFACTS"
touch /work/compiled
