# s46 call 1: the whole CUDA suite (8 shards), then this session's head-rows change old against new on the random
# bench pair and medusa's tree against its chain (traces.sh), the machine quiet.
export PYTHONPATH=$PWD/.device-pkgs
S=benchmarks/results/h100/s46-2026-12-06
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=${SUITE_LIMIT:-300} OUT=/tmp/gc RUN_AFTER="OUT=$OUT EACH=30 bash $S/traces.sh" \
  AFTER_LIMIT=${AFTER_LIMIT:-235} AFTER_TAIL=45 bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
tar czf $OUT/gc.tgz -C /tmp gc gc.console
grep -v "^DEBUG" /tmp/gc.console | tail -60
