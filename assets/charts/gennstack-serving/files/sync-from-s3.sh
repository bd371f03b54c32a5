#!/bin/sh
# Copies one model revision (and, for Neuron, its compiled artifacts) from S3 into the node's
# cache with s5cmd. `sync` copies only what is missing or differs, so on a node a warm spare or an
# earlier pod already filled this is a listing, not a download. Staged data is marked complete by
# a `.gennstack-complete` object; without it the pod fails instead of serving a partial model.
#   env: MODELS_BUCKET MODEL_PREFIX MODEL_DIR [COMPILE_BUCKET COMPILE_PREFIX COMPILED_DIR]
#        S5CMD_WORKERS, MODE = serve (default) | compile (wait for staging, skip when already compiled)
set -eu
MARKER=.gennstack-complete
s5() { /s5cmd --numworkers "$S5CMD_WORKERS" "$@"; }
exists() { /s5cmd ls "$1" >/dev/null 2>&1; }

model_marker="s3://$MODELS_BUCKET/$MODEL_PREFIX$MARKER"
if [ "${MODE:-serve}" = compile ]; then
  if exists "s3://$COMPILE_BUCKET/$COMPILE_PREFIX$MARKER"; then
    echo "compiled artifacts already in s3://$COMPILE_BUCKET/$COMPILE_PREFIX: nothing to do"
    touch /work/skip
    exit 0
  fi
  until exists "$model_marker"; do
    echo "waiting for the staging Job to finish $model_marker"
    sleep 60
  done
elif ! exists "$model_marker"; then
  echo "$model_marker is missing: stage the model first (staging.enabled=true, see docs/serving.md)" >&2
  exit 1
fi

mkdir -p "$MODEL_DIR"
s5 sync "s3://$MODELS_BUCKET/$MODEL_PREFIX*" "$MODEL_DIR/"
echo "weights of s3://$MODELS_BUCKET/$MODEL_PREFIX are in $MODEL_DIR"

if [ "${MODE:-serve}" = serve ] && [ -n "${COMPILE_PREFIX:-}" ]; then
  compiled_marker="s3://$COMPILE_BUCKET/$COMPILE_PREFIX$MARKER"
  if ! exists "$compiled_marker"; then
    echo "$compiled_marker is missing: run the compile Job first (staging.enabled=true); serving never compiles" >&2
    exit 1
  fi
  mkdir -p "$COMPILED_DIR"
  s5 sync "s3://$COMPILE_BUCKET/$COMPILE_PREFIX*" "$COMPILED_DIR/"
  echo "compiled artifacts of s3://$COMPILE_BUCKET/$COMPILE_PREFIX are in $COMPILED_DIR"
fi
