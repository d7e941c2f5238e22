# s39 call 1: the whole CUDA suite (the per-row few-row kernel's first CUDA tests), then the few-row timings of
# s38's next-device.md step 2 (where the fused few-row verify step's time goes; the per-row form's wider tiles).
export PYTHONPATH=$PWD/.device-pkgs
nvidia-smi --query-gpu=name --format=csv,noheader
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=300 OUT=/tmp/gc bash benchmarks/gpu_check.sh > $OUT/suite-console.log 2>&1
tail -5 $OUT/suite-console.log
tar czf $OUT/gc.tgz -C /tmp gc
cd benchmarks
timeout 60 python3 verify_profile.py --size 1b --q 4 > $OUT/profile.txt 2>&1; echo "profile rc $?"
timeout 90 python3 rows_linear.py --sizes bench 1b 3b --rows 4 6 8 --variants dot16x256 dot32x128 each256 each512 \
  each1024 --out $OUT > $OUT/rows_linear.log 2>&1; echo "rows_linear rc $?"
timeout 90 python3 target_linear.py --sizes bench 1b --batch 1 --q 4 6 --modes cublas one fused fused-each --rounds 1 \
  --out $OUT > $OUT/target_linear.log 2>&1; echo "target_linear rc $?"
tail -30 $OUT/rows_linear.log $OUT/target_linear.log
