# s46 call 1: the whole CUDA suite (8 shards) with the trained bench pair built beside it (pair.sh, into /tmp/bm, for
# call 2), then this session's head-rows change profiled old against new on the random bench pair (traces.sh).
export PYTHONPATH=$PWD/.device-pkgs
S=benchmarks/results/h100/s46-2026-12-06
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=${SUITE_LIMIT:-330} OUT=/tmp/gc BACKGROUND="OUT=$OUT bash $S/pair.sh" BG_TAIL=8 \
  RUN_AFTER="OUT=$OUT bash $S/traces.sh" AFTER_LIMIT=${AFTER_LIMIT:-170} AFTER_TAIL=40 \
  bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
cp /tmp/gc/after.log $OUT/ 2>/dev/null
tar czf $OUT/gc.tgz -C /tmp gc gc.console
cat /tmp/gc.console | grep -v "^DEBUG" | tail -60
