# s40 call 1: the whole CUDA suite on s39's final library (1f974ce), then what a seeded (T = 0.8) plain step costs a
# method's engine against the baseline's (s39 measured greedy only; the grid's mostly-plain T = 0.8 rows ran
# 0.82-0.90x on completion), with host timers per step function.
export PYTHONPATH=$PWD/.device-pkgs
nvidia-smi --query-gpu=name --format=csv,noheader
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=300 OUT=/tmp/gc bash benchmarks/gpu_check.sh > $OUT/suite-console.log 2>&1
tail -9 $OUT/suite-console.log
tar czf $OUT/gc.tgz -C /tmp gc
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb')" > $OUT/rb.log 2>&1
for wl in completion repeated; do
  timeout ${PO_LIMIT:-120} python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods ngram:4 eagle3:3 suffix:4 \
    --batch 8 --temperature 0.8 --workload $wl --prompts 64 --repeats 5 --host-timers --out $OUT/plain-overhead-$wl.json \
    > $OUT/plain-overhead-$wl.txt 2>&1
  echo "plain_overhead $wl rc $?"; grep -E "plain-only|x of the" $OUT/plain-overhead-$wl.txt | tail -6
done
