#!/usr/bin/env bash
# Everything specdec measures on a GPU, in few calls (device time is scarce). From the repo root:
#   PHASE=1 bash benchmarks/gpu_suite.sh   # install, build the bench model pair, CUDA tests, sampler kernels
#   PHASE=2 bash benchmarks/gpu_suite.sh   # decode-step split and the end-to-end benchmark
# (no PHASE: both). Each stage has its own time limit so a slow one cannot starve the rest; results
# go to $OUT/res and are packed into $OUT/results.tgz. The bench models live in .bench-models/
# (git-ignored), so a second call on the same warm machine reuses them.
set -u
OUT=${OUT:-benchmarks/results/gpu}
PHASE=${PHASE:-all}
mkdir -p "$OUT/res"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log() { echo "=== $(date +%T) $*"; }
stage() { local limit=$1; shift; log "$*"; timeout "$limit" "$@" 2>&1 | grep -v "Loading weights\|Writing model" | tail -${TAIL:-40}; }

log "environment (phase $PHASE)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/ngram -e plugins/draft_model \
    -e tests/fixtures/specdec-plugin-copycat 2>&1 | grep -v WARNING | tail -3
BENCH=${BENCH_DIR:-.bench-models}

if [ "$PHASE" != 2 ]; then
  if [ ! -f "$BENCH/bench-draft/model.safetensors" ]; then
    stage ${TRAIN_LIMIT:-240} python3 -m specdec.zoo --preset bench bench-draft --out "$BENCH" --device cuda \
        --max-minutes ${TRAIN_MINUTES:-1.2}
  fi
  cp "$BENCH/bench/README.md" "$OUT/res/bench-card.md" 2>/dev/null
  cp "$BENCH/bench-draft/README.md" "$OUT/res/bench-draft-card.md" 2>/dev/null
  stage 150 python3 -m pytest -q -p no:cacheprovider tests/core/test_rejection_triton.py tests/core/test_cuda_graphs.py \
      tests/plugins/ngram/test_ngram_kernel.py tests/core/test_target.py tests/plugins/draft_model
  stage ${SAMPLER_LIMIT:-150} python3 benchmarks/bench_sampler.py --batch 1 64 256 -k 1 5 8 --vocab 32000 128256 \
      --modes random --block-v 2048 --out "$OUT/res/sampler.json"
  TAIL=15 stage 120 python3 benchmarks/bench_sampler.py --check --out "$OUT/res/sampler_check.json"
fi
if [ "$PHASE" != 1 ]; then
  [ -f "$BENCH/bench/model.safetensors" ] || { log "no bench model in $BENCH: run phase 1 first"; exit 1; }
  stage 150 python3 benchmarks/bench_step.py --model "$BENCH/bench" --method ngram -k 4 --batch 1 32 \
      --max-tokens 64 --out "$OUT/res/step.json"
  stage ${E2E_LIMIT:-330} python3 benchmarks/e2e.py --device cuda --model "$BENCH/bench" \
      --draft-model "$BENCH/bench-draft" ${E2E_ARGS:---batch 1 32 --prompts 4 --max-tokens 96 --temperature 0 \
      --methods ngram draft_model --repeats 2 --no-progress} --out "$OUT/res" --name e2e-h200
fi
tar -C "$OUT" -czf "$OUT/results.tgz" res && log "results in $OUT/results.tgz"
