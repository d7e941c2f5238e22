# s48 call A (~500 s): the whole CUDA suite in 8 shards with the trained bench pair built beside it (s46's pair.sh as
# gpu_check's BACKGROUND: target, eagle3 and medusa heads into /tmp/bm, kept for call B on the warm machine), then
# eagle's CUDA tests with head steps of up to 16 rows through the few-row kernel (HEAD_ROWS 16, never run compiled).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
S=benchmarks/results/h200/s48-2026-12-07
SHARDS=8 SHARD_THREADS=1 SUITE_LIMIT=${SUITE_LIMIT:-360} OUT=/tmp/gc \
  BACKGROUND="OUT=/tmp/gc bash benchmarks/results/h100/s46-2026-12-06/pair.sh" \
  RUN_AFTER="bash $S/rows16.sh" AFTER_LIMIT=${AFTER_LIMIT:-100} SKIP_AFTER=${SKIP_AFTER:-470} AFTER_TAIL=8 \
  bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
cp -r /tmp/bm/*.json $OUT/ 2>/dev/null
tar czf $OUT/gc.tgz -C /tmp gc gc.console
nvidia-smi --query-gpu=name --format=csv,noheader
grep -v "^DEBUG" /tmp/gc.console | tail -40
