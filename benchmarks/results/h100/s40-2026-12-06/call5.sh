# s40 call 5: the whole CUDA suite on the session's final library, then host timers of a plain step at T = 0 and 0.8
# (the baseline's and ngram's / suffix's, every step plain) on whatever card comes.
export PYTHONPATH=$PWD/.device-pkgs
nvidia-smi --query-gpu=name --format=csv,noheader
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=300 OUT=/tmp/gc bash benchmarks/gpu_check.sh > $OUT/suite-console.log 2>&1
tail -9 $OUT/suite-console.log
tar czf $OUT/gc.tgz -C /tmp gc
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb')" > $OUT/rb.log 2>&1
timeout ${PO_LIMIT:-110} python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods ngram:4 suffix:4 \
  --batch 8 --temperature 0 0.8 --workload completion --prompts 64 --repeats 5 --host-timers \
  --out $OUT/plain-overhead.json > $OUT/plain-overhead.txt 2>&1
echo "plain_overhead rc $?"; grep -E "plain-only" $OUT/plain-overhead.txt
