# s35 call 3: the whole suite on the session's tree (5 shards) beside the bench pair's build, then issue 24's
# batch-8 grid (grid-long.sh) on the tree if time is left. Outputs under $OUT (tarred: the device tool drops files
# past a count).
export PYTHONPATH=$PWD/.device-pkgs
OUT_DIR=$OUT
OUT=/tmp/gc SHARDS=5 SUITE_LIMIT=330 SKIP_AFTER=370 AFTER_LIMIT=205 AFTER_TAIL=14 \
  RUN_AFTER="OUT=/tmp/gc LIMIT=200 bash benchmarks/results/h200/s32-2026-12-05/next/grid-long.sh" \
  BACKGROUND="OUT=/tmp/gc bash $PWD/benchmarks/results/h200/s27-2026-12-04/call1/bg.sh" \
  timeout 578 bash benchmarks/gpu_check.sh
tar czf $OUT_DIR/gc.tgz -C /tmp gc
