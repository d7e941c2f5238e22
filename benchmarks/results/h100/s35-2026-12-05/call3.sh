# s35 call 3: the whole suite on the session's tree (8 shards) beside the bench pair's build, then issue 24's
# batch-8 grid (grid-long.sh), auto rows only (fixed k is unchanged this session: call 2's rows), if time is left.
# Outputs under $OUT (tarred: the device tool drops files past a count).
export PYTHONPATH=$PWD/.device-pkgs
OUT_DIR=$OUT
OUT=/tmp/gc SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=280 SKIP_AFTER=345 AFTER_LIMIT=215 AFTER_TAIL=14 \
  RUN_AFTER="OUT=/tmp/gc LIMIT=210 METHODS='eagle3:3@auto ngram:4@auto suffix:4@auto' bash benchmarks/results/h200/s32-2026-12-05/next/grid-long.sh" \
  BACKGROUND="OUT=/tmp/gc bash $PWD/benchmarks/results/h200/s27-2026-12-04/call1/bg.sh" \
  timeout 578 bash benchmarks/gpu_check.sh
tar czf $OUT_DIR/gc.tgz -C /tmp gc
