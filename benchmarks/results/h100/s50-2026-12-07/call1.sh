# s50 call 1 (~590 s): the whole CUDA suite in 8 shards (first GPU run of s49's DraftKeys), the trained bench pair
# built beside it (s46's pair.sh into /tmp/bm, kept for the next call on the warm machine), then after.sh.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
S=benchmarks/results/h100/s50-2026-12-07
SHARDS=8 SHARD_THREADS=1 SUITE_LIMIT=${SUITE_LIMIT:-360} OUT=/tmp/gc \
  BACKGROUND="OUT=/tmp/gc bash benchmarks/results/h100/s46-2026-12-06/pair.sh" \
  RUN_AFTER="bash $S/after.sh" AFTER_LIMIT=${AFTER_LIMIT:-170} SKIP_AFTER=${SKIP_AFTER:-470} AFTER_TAIL=40 \
  bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
cp -r /tmp/bm/*.json $OUT/ 2>/dev/null
tar czf $OUT/gc.tgz -C /tmp gc gc.console
nvidia-smi --query-gpu=name --format=csv,noheader
grep -v "^DEBUG" /tmp/gc.console | tail -60
