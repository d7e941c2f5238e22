# s51 call F (fresh machine, what device time was left: ~220 s): the whole CUDA suite in 12 shards on this session's
# final library (timed plain steps bare), then, if time is left, call E's row again (random bench-shaped pair,
# medusa:2, batch 32, T = 0.8, completion, traced) on it: call E (the library before it) had auto at 0.82x of the
# baseline with drafting judged 1.38x faster on plain steps timed at ~0.9 ms.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
SHARDS=12 SHARD_THREADS=1 SUITE_LIMIT=${SUITE_LIMIT:-150} OUT=$OUT/gc bash benchmarks/gpu_check.sh > $OUT/gc.console 2>&1
grep -v "^DEBUG" $OUT/gc.console | tail -16
if [ $SECONDS -lt ${MEASURE_BEFORE:-160} ]; then
  cd benchmarks
  python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb', 'medusa'))" > $OUT/rb.log 2>&1
  timeout 60 python3 policy_steps.py --device cuda --model /tmp/rb/target --draft-model /tmp/rb/medusa --method medusa:2 \
    --batch 32 --temperature 0.8 --workload completion --prompts 64 --calls 99 --max-tokens 128 --repeats 2 \
    --trace $OUT/trace-medusa-b32-t08.jsonl > $OUT/steps.txt 2>&1
  echo "steps rc $? at $SECONDS s"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto) |by reason" $OUT/steps.txt | cut -c1-300
else
  echo "no time left for the measurement ($SECONDS s)"
fi
