#!/bin/bash
# Compiles a model by starting the exact vLLM server the serving pods run (same arguments and
# environment, so the artifacts match what serving loads). Neuron: with NEURON_COMPILED_ARTIFACTS
# pointing at an empty directory, vLLM's Neuron worker compiles and saves there. g6e: vLLM and
# Triton write their compile cache under VLLM_CACHE_ROOT (torch.compile, AOT compile and CUDA
# graph capture run in engine start-up, before the API server answers, vllm 0.29.0
# vllm/v1/engine/core.py). Once the server answers /health the set is complete; the server is
# stopped and the upload container takes over.
#   env: VLLM_ARGS (JSON list of arguments after `vllm serve`), and NEURON_COMPILED_ARTIFACTS or VLLM_CACHE_ROOT
set -euo pipefail
if [ -f /work/skip ]; then
  echo "already compiled: nothing to do"
  exit 0
fi
out="${NEURON_COMPILED_ARTIFACTS:-${VLLM_CACHE_ROOT:?NEURON_COMPILED_ARTIFACTS or VLLM_CACHE_ROOT must be set}}"
rm -rf "$out"   # never upload a half-written set from an earlier attempt
mkdir -p "$out"
python3 /scripts/vllm_serve.py 127.0.0.1 8000 &
server=$!
started=$(date +%s)
healthy() {
  python3 -c 'import sys, urllib.request; sys.exit(urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=5).status != 200)' 2>/dev/null
}
until healthy; do
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
# The object-storage loader's copy of the model's config and tokenizer files
# (<VLLM_ASSETS_CACHE>/model_streamer/, vllm 0.29.0 vllm/transformers_utils/runai_utils.py
# ObjectStorageModel; VLLM_ASSETS_CACHE defaults to ~/.cache/vllm/assets, vllm/envs.py, which with
# HOME=/home/vllm is <VLLM_CACHE_ROOT>/assets): not compile output; each server fetches its own.
if [ -z "${NEURON_COMPILED_ARTIFACTS:-}" ]; then
  rm -rf "$out/assets"
fi
# The compile ran as another user than the upload: every file readable, every folder listable.
chmod -R a+rX "$out"
touch /work/compiled
