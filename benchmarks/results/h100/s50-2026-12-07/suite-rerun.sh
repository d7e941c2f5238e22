# s50 call 2 (179 s, same warm machine, right after call1.sh): call 1's suite shards that failed, rerun alone. In
# call 1 every failure was an allocation failure (torch.OutOfMemoryError, cudaErrorMemoryAllocation, MemoryError, and
# the cudaErrorUnknown after them): the pair's training beside eight shards filled the H100's 80 GB (s48 ran the same
# on a 141 GB H200). Shards 0 and 5 had passed whole; this reruns the test files of shards 1-4, 6, 7 over 8 shards.
export PYTHONPATH=$PWD/.device-pkgs
KEEP="1 2 3 4 6 7" OF=8 SHARDS=8 SHARD_THREADS=1 SUITE_LIMIT=330 OUT=/tmp/gc2 bash benchmarks/gpu_check.sh > /tmp/gc2.console 2>&1
tar czf $OUT/gc2.tgz -C /tmp gc2 gc2.console; tail -15 /tmp/gc2.console
