# s46 call 1: the whole CUDA suite (8 shards) with the trained bench pair built beside it (pair.sh, into /tmp/bm, for
# calls 2 and 3 on the same warm machine).
export PYTHONPATH=$PWD/.device-pkgs
S=benchmarks/results/h100/s46-2026-12-06
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=${SUITE_LIMIT:-330} OUT=/tmp/gc BACKGROUND="OUT=$OUT bash $S/pair.sh" BG_TAIL=8 \
  bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
tar czf $OUT/gc.tgz -C /tmp gc gc.console
grep -v "^DEBUG" /tmp/gc.console | tail -40
