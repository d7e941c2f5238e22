# s41 call 6: the whole CUDA suite on the session's final library (the policy's changes: cheaper drafting steps,
# fresh batches' first drafting step not learned as a switch, the end rule's probe of fresh batches).
export PYTHONPATH=$PWD/.device-pkgs
nvidia-smi --query-gpu=name --format=csv,noheader
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=300 OUT=/tmp/gc bash benchmarks/gpu_check.sh > $OUT/suite-console.log 2>&1
tail -9 $OUT/suite-console.log
tar czf $OUT/gc.tgz -C /tmp gc
