#!/usr/bin/env bash
# One device call that checks a change on the GPU (from the repo root, on the H200 through the device tool):
#  1. installs the repo's distributions into the machine's python (no deps, editable) and the fixtures;
#  2. runs the WHOLE test suite, CUDA tests included, split over SHARDS parallel pytest processes (one
#     GPU, 16 cores: the suite's wall time shrinks about SHARDS-fold), logs kept in $OUT/cuda-suite/;
#  3. optional: RUN_AFTER, a command run after the suite (e.g. a diagnosis script);
#  4. optional (OLD_TREE=.old-tree, an earlier commit's core/ and plugins/ carried along): the same-run
#     old-vs-new e2e timing at batch 32 on random-init models of the bench pair's shapes with the bundled
#     tokenizer (no model build: the engine's own cost, not acceptance, is what changes).
#  BACKGROUND: a command started before the suite and waited for after it (e.g. a model build: the GPU has room);
#  SKIP_AFTER: seconds after which the optional stages 3 and 4 are skipped (a device call has a hard limit).
#  KEEP="2 3" (with OF=4): only the test files shards 2 and 3 of an OF-shard run held (a rerun of failed shards).
#  SUITE=0: skip stage 2 (a call that only measures, after a suite run on the same tree).
# Usage: SHARDS=3 RUN_AFTER="python3 benchmarks/gpu_rope_capture.py" OLD_TREE=.old-tree bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-benchmarks/results/gpu-check}
SHARDS=${SHARDS:-3}
mkdir -p "$OUT/cuda-suite"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) -e adapters/vllm \
    > "$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
python3 -m pip install -q --no-deps --no-build-isolation tests/fixtures/specdec-plugin-* >> "$OUT/install.log" 2>&1 \
    || tail -5 "$OUT/install.log"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'triton', triton.__version__)"; } > "$OUT/cuda-suite/env.txt" 2>&1
cat "$OUT/cuda-suite/env.txt"
export PYTHONPATH="$PWD/.device-pkgs${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${BACKGROUND:-}" ]; then
  bash -c "$BACKGROUND" > "$OUT/background.log" 2>&1 &
  BG=$!
fi
mapfile -t FILES < <(find tests -name 'test_*.py' | sort)
if [ -n "${KEEP:-}" ]; then  # KEEP="2 3" OF=4: rerun only what shards 2 and 3 of an OF-shard run held
  kept=()
  for ((i = 0; i < ${#FILES[@]}; i++)); do
    [[ " $KEEP " == *" $(( i % ${OF:-4} )) "* ]] && kept+=("${FILES[$i]}")
  done
  FILES=("${kept[@]}")
fi
[ "${SUITE:-1}" = 0 ] && SHARDS=0
t0=$(date +%s)
PIDS=()
for ((s = 0; s < SHARDS; s++)); do
  mine=()
  for ((i = s; i < ${#FILES[@]}; i += SHARDS)); do mine+=("${FILES[$i]}"); done
  OMP_NUM_THREADS=${SHARD_THREADS:-3} timeout "${SUITE_LIMIT:-420}" python3 -m pytest -q -p no:cacheprovider -rs "${mine[@]}" 2>&1 | grep -v "^DEBUG" \
      > "$OUT/cuda-suite/shard-$s.log" &
  PIDS+=($!)
done
[ "$SHARDS" -gt 0 ] && wait "${PIDS[@]}"  # the shards only: a bare wait would wait for BACKGROUND too
[ "$SHARDS" -gt 0 ] && echo "suite: $(( $(date +%s) - t0 )) s wall in $SHARDS shards"
for ((s = 0; s < SHARDS; s++)); do echo "shard $s: $(tail -n 1 "$OUT/cuda-suite/shard-$s.log")"; done
grep -h "^FAILED\|^ERROR" "$OUT"/cuda-suite/shard-*.log 2>/dev/null | head -20
if [ -n "${BACKGROUND:-}" ]; then
  wait "$BG"; echo "background rc $? after $SECONDS s"
  tr '\r' '\n' < "$OUT/background.log" | grep -v "Loading\|Writing\|^ *$" | tail -"${BG_TAIL:-12}"
fi
late() { [ "$SECONDS" -ge "${SKIP_AFTER:-100000}" ] && echo "skipped $1: $SECONDS s elapsed"; }
if [ -n "${RUN_AFTER:-}" ] && ! late RUN_AFTER; then
  echo "=== $RUN_AFTER"
  timeout "${AFTER_LIMIT:-120}" bash -c "$RUN_AFTER" > "$OUT/after.log" 2>&1
  grep -v "Loading weights\|Writing model" "$OUT/after.log" | tail -"${AFTER_TAIL:-30}"
fi
if [ -n "${OLD_TREE:-}" ] && ! late OLD_TREE; then
  R=/tmp/specdec-random-bench
  python3 - "$R" <<'EOF'
import shutil, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from specdec import bundled_model
root = sys.argv[1]
for name, dims in (("target", dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=12, num_attention_heads=12)),
                   ("draft", dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8))):
    torch.manual_seed(0)
    path = f"{root}/{name}"
    LlamaForCausalLM(LlamaConfig(vocab_size=4096, max_position_embeddings=1024, **dims)).to(torch.bfloat16).save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{bundled_model('tiny')}/{f}", path)
EOF
  for v in old new; do
    P=""; [ $v = old ] && P="$PWD/$OLD_TREE/core:$PWD/$OLD_TREE/plugins/ngram:$PWD/$OLD_TREE/plugins/draft_model:"
    PYTHONPATH="$P$PYTHONPATH" timeout "${B32_LIMIT:-90}" python3 benchmarks/e2e.py --device cuda --model $R/target \
        --draft-model $R/draft --batch 32 --prompts 96 --max-tokens 64 --temperature 0 --repeats 2 \
        --methods ngram draft_model:3 --no-peers --no-plots --no-progress --out "$OUT/b32-$v" --name b32-$v \
        > "$OUT/b32-$v.log" 2>&1
    echo "b32 $v rc $?"; grep -E "^\| (completion|edit|repeated) " "$OUT/b32-$v/b32-$v.md" | cut -c1-100
  done
fi
