#!/bin/sh
# Uploads a finished compile to the compile-cache bucket, then writes the marker that serving
# pods require. Runs only after the compile init container succeeded (or skipped).
#   env: COMPILE_BUCKET COMPILE_PREFIX COMPILED_DIR S5CMD_WORKERS
set -eu
if [ -f /work/skip ]; then
  echo "already compiled: nothing to upload"
  exit 0
fi
[ -f /work/compiled ] || { echo "no finished compile to upload" >&2; exit 1; }
/s5cmd --numworkers "$S5CMD_WORKERS" sync "$COMPILED_DIR/" "s3://$COMPILE_BUCKET/$COMPILE_PREFIX"
date -u +'{"compiled_at": "%Y-%m-%dT%H:%M:%SZ"}' | /s5cmd pipe "s3://$COMPILE_BUCKET/$COMPILE_PREFIX.gennstack-complete"
echo "uploaded to s3://$COMPILE_BUCKET/$COMPILE_PREFIX"
