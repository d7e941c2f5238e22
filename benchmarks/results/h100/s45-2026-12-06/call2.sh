# s45 call 2: the whole CUDA suite at this session's tree (eagle's captured tree step with the fused kernels' float
# mask and Triton top-k, medusa's captured tree step, the one-launch tree step tensors).
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=${SUITE_LIMIT:-400} OUT=/tmp/gc bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
tar czf $OUT/gc.tgz -C /tmp gc gc.console
tail -5 /tmp/gc.console
