# s44 call 1: the whole CUDA suite at the tree with the CPU's fused default and the packed-GQA torch attention
# (the path tiny drafts with head_dim 8 take on CUDA).
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=330 OUT=/tmp/gc bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
tar czf $OUT/gc.tgz -C /tmp gc gc.console
tail -5 /tmp/gc.console
