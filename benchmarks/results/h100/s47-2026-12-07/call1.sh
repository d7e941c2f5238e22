# s47 call 1: the whole CUDA suite (8 shards; s46's rewritten few-row kernel had not run compiled), then traces.sh.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
S=benchmarks/results/h100/s47-2026-12-07
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=${SUITE_LIMIT:-300} OUT=/tmp/gc RUN_AFTER="OUT=$OUT EACH=35 bash $S/traces.sh" \
  AFTER_LIMIT=${AFTER_LIMIT:-250} AFTER_TAIL=45 bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
tar czf $OUT/gc.tgz -C /tmp gc gc.console
nvidia-smi --query-gpu=name --format=csv,noheader
grep -v "^DEBUG" /tmp/gc.console | tail -60
