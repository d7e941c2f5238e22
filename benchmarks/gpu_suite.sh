#!/usr/bin/env bash
# Everything specdec measures on a GPU, in few calls (device time is scarce). From the repo root:
#   PHASE=kernels bash benchmarks/gpu_suite.sh  # install, CUDA tests, sampler kernels, step split (random 88M)
#   PHASE=e2e bash benchmarks/gpu_suite.sh      # install, build the bench model pair, step split, e2e benchmark
#   B32=1 B32_ARGS="--prefill-graph-tokens 0" PHASE=e2e ...   # also batch 32 (here without prefill graphs)
#   PARTS=1 PHASE=e2e ...                       # first, where each step's time goes (gpu_parts.py)
#   SUFFIX=1 ...   # also the suffix plugin, its backend carried in .device-pkgs/ (build_suffix_backend.sh)
# (no PHASE: both). Each stage has its own time limit so a slow one cannot starve the rest; results
# go to $OUT/res and are packed into $OUT/results.tgz. The bench models live in .bench-models/
# (git-ignored), so a later call on the same warm machine reuses them.
set -u
OUT=${OUT:-benchmarks/results/gpu}
PHASE=${PHASE:-all}
mkdir -p "$OUT/res/logs"
export PYTHONUNBUFFERED=1
log() { echo "=== $(date +%T) $*"; }
# Each stage's whole output is kept in $OUT/res/logs/NN.log; the reply shows its last lines.
N_STAGE=0
stage() {
  local limit=$1; shift; N_STAGE=$((N_STAGE + 1)); local f; f=$(printf "%s/res/logs/%02d.log" "$OUT" $N_STAGE)
  log "$*"; echo "$*" > "$f"; timeout "$limit" "$@" >> "$f" 2>&1; local rc=$?
  tr '\r' '\n' < "$f" | grep -v "Loading weights\|Writing model\|Capturing\|^ *$" | tail -${TAIL:-40}
  [ $rc -eq 0 ] || log "rc $rc ($f)"
}

log "environment (phase $PHASE)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
[ -n "${NO_INSTALL:-}" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/ngram -e plugins/draft_model \
    -e tests/fixtures/specdec-plugin-copycat 2>&1 | grep -v WARNING | tail -3
if [ -n "${SUFFIX:-}" ]; then  # arctic-inference's suffix tree, built elsewhere for this python (no fetch here)
  export PYTHONPATH="$PWD/.device-pkgs${PYTHONPATH:+:$PYTHONPATH}"
  [ -n "${NO_INSTALL:-}" ] || python3 -m pip install -q --no-deps --no-build-isolation -e plugins/suffix 2>&1 \
      | grep -v WARNING | tail -3
  python3 -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; import specdec; \
print('suffix backend ok; methods:', ', '.join(sorted(specdec.available_methods())))"
fi
BENCH=${BENCH_DIR:-.bench-models}

if [ "$PHASE" != e2e ]; then
  stage 150 python3 -m pytest -q -p no:cacheprovider tests/core/test_rejection_triton.py tests/core/test_cuda_graphs.py \
      tests/plugins/ngram/test_ngram_kernel.py tests/core/test_target.py tests/plugins/draft_model
  stage ${SAMPLER_LIMIT:-200} python3 benchmarks/bench_sampler.py --batch 1 64 256 -k 1 5 8 --vocab 32000 128256 \
      --modes random greedy --block-v 2048 --out "$OUT/res/sampler.json"
  TAIL=8 stage 120 python3 benchmarks/bench_sampler.py --batch 256 -k 5 --vocab 128256 --modes random \
      --block-v 1024 2048 --splits 0 1 6 12 24 --out "$OUT/res/sampler_splits.json"
  TAIL=15 stage 120 python3 benchmarks/bench_sampler.py --check --out "$OUT/res/sampler_check.json"
  TAIL=12 stage 150 python3 benchmarks/bench_step.py --method ngram -k 4 --batch 1 32 --max-tokens 64 \
      --out "$OUT/res/step_random88m.json"
fi
# DEBUG_CHAIN="fused-triton-rope ...": gpu_debug_chain.py's configurations first (random-init models, no build);
# DEBUG_ARGS adds options, e.g. "--batch 1 --sanitizer --timeout 280" (with DEBUG_LIMIT=300).
[ -z "${DEBUG_CHAIN:-}" ] || TAIL=${DEBUG_TAIL:-12} stage ${DEBUG_LIMIT:-150} python3 benchmarks/gpu_debug_chain.py \
    --configs $DEBUG_CHAIN ${DEBUG_ARGS:-}
# PARTS=1: device time and kernels of each captured graph, and the host's share of each step phase
# (gpu_parts.py, random-init models of the bench pair's shapes, no build).
[ -z "${PARTS:-}" ] || TAIL=${PARTS_TAIL:-30} stage ${PARTS_LIMIT:-150} python3 benchmarks/gpu_parts.py \
    ${PARTS_ARGS:-} --out "$OUT/res/parts.json"
if [ "$PHASE" != kernels ]; then
  # The tokenizer encodes the corpus on every core (the variable is set for these stages alone). The pair
  # takes about 350 s; with the target already there (a warm machine) only a missing draft is built, or
  # the draft again with REBUILD_DRAFT=1, distilled from the saved target (about 150 s).
  if [ ! -f "$BENCH/bench/model.safetensors" ]; then
    TOKENIZERS_PARALLELISM=true stage ${TRAIN_LIMIT:-420} python3 -m specdec.zoo --preset bench bench-draft \
        --out "$BENCH" --device cuda ${TRAIN_ARGS:-}
  elif [ ! -f "$BENCH/bench-draft/model.safetensors" ] || [ -n "${REBUILD_DRAFT:-}" ]; then
    TOKENIZERS_PARALLELISM=true stage ${TRAIN_LIMIT:-240} python3 -m specdec.zoo --preset bench-draft \
        --out "$BENCH/bench-draft" --teacher "$BENCH/bench" --device cuda ${TRAIN_ARGS:-}
  fi
  cp "$BENCH/bench/README.md" "$OUT/res/bench-card.md" 2>/dev/null
  cp "$BENCH/bench-draft/README.md" "$OUT/res/bench-draft-card.md" 2>/dev/null
  [ -f "$BENCH/bench/model.safetensors" ] || { log "no bench model in $BENCH"; exit 1; }
  export TOKENIZERS_PARALLELISM=false
  [ -n "${NO_TESTS:-}" ] || TAIL=6 stage 90 python3 -m pytest -q -p no:cacheprovider -k cuda tests/plugins/draft_model tests/core/test_cuda_graphs.py
  if [ -z "${NO_STEP:-}" ]; then
    TAIL=70 stage 150 python3 benchmarks/bench_step.py --model "$BENCH/bench" --method ngram -k 4 --batch 1 32 \
        --max-tokens 64 --profile 12 ${STEP_ARGS:-} --out "$OUT/res/step.json"
  fi
  [ -n "${E2E_SKIP:-}" ] || stage ${E2E_LIMIT:-400} python3 benchmarks/e2e.py --device cuda --model "$BENCH/bench" \
      --draft-model "$BENCH/bench-draft" ${E2E_ARGS:---batch 1 32 --prompts 4 --max-tokens 96 --temperature 0 \
      --methods ngram draft_model:3 --repeats 2 --no-progress} --out "$OUT/res" --name ${E2E_NAME:-e2e-h200}
  # Batch 32, 320 requests through 32 slots (B32=1); B32_ARGS adds options, e.g. --prompts 96.
  [ -z "${B32:-}" ] || stage ${B32_LIMIT:-200} python3 benchmarks/e2e.py --device cuda --model "$BENCH/bench" \
      --draft-model "$BENCH/bench-draft" --batch 32 --prompts 320 --max-tokens 96 --temperature 0 --repeats 1 \
      --methods ngram draft_model:3 --no-peers --no-progress ${B32_ARGS:-} --out "$OUT/res" --name ${B32_NAME:-e2e-b32}
fi
tar -C "$OUT" -czf "$OUT/results.tgz" res && log "results in $OUT/results.tgz"
