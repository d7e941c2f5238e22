#!/usr/bin/env bash
# Everything specdec measures on a GPU, in one call (device time is scarce): install, build the
# bench model pair, CUDA-only tests, sampler kernels, decode-step split, end-to-end benchmark.
# Usage on the device machine, from the repository root:  bash benchmarks/gpu_suite.sh
# Each stage has its own time limit so a slow stage cannot starve the rest; results go to $OUT.
set -u
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT/res"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log() { echo "=== $(date +%T) $*"; }
stage() { local limit=$1; shift; log "$*"; timeout "$limit" "$@" 2>&1 | grep -v "Loading weights\|Writing model" | tail -60; }

log "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/ngram -e plugins/draft_model \
    -e tests/fixtures/specdec-plugin-copycat 2>&1 | grep -v WARNING | tail -3

BENCH=${BENCH_DIR:-/tmp/specdec-bench}
if [ ! -f "$BENCH/bench/model.safetensors" ]; then
  stage ${TRAIN_LIMIT:-240} python3 -m specdec.zoo --preset bench bench-draft --out "$BENCH" --device cuda \
      --max-minutes ${TRAIN_MINUTES:-1.5}
fi
cp "$BENCH"/bench/metrics.json "$OUT/res/bench-metrics.json" 2>/dev/null
cp "$BENCH"/bench-draft/metrics.json "$OUT/res/bench-draft-metrics.json" 2>/dev/null

stage 120 python3 -m pytest -q -x -p no:cacheprovider tests/core/test_cuda_graphs.py tests/core/test_rejection_triton.py \
    tests/plugins/ngram/test_ngram_kernel.py tests/core/test_target.py
[ -f benchmarks/bench_sampler.py ] && stage 120 python3 benchmarks/bench_sampler.py --check --out "$OUT/res/sampler.json"
stage 120 python3 benchmarks/bench_step.py --model "$BENCH/bench" --method ngram -k 4 --batch 1 32 \
    --max-tokens 64 --out "$OUT/res/step.json"
[ -f benchmarks/e2e.py ] && stage ${E2E_LIMIT:-240} python3 benchmarks/e2e.py --device cuda --model "$BENCH/bench" \
    --draft-model "$BENCH/bench-draft" ${E2E_ARGS:-} --out "$OUT/res/e2e"
tar -C "$OUT" -czf "$OUT/results.tgz" res && log "results in $OUT/results.tgz"
