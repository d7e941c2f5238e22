# s37 call 1: the whole CUDA suite alone on the tree at the session's start (02ed658: s36's end rule), logs tarred
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=280 OUT=/tmp/gc bash benchmarks/gpu_check.sh
tar czf $OUT/gc.tgz -C /tmp gc
