# s53 call 1 (fresh machine, <= 580 s): the whole CUDA suite in 8 shards on this session's library (it covers s52's
# review refactors: SamplingParams.keyed / .free on the verifier, tree and keyed paths, and the TIMED_BARE gate); then
# on a random bench-shaped pair (gpu_eagle_profile.random_bench), plain_overhead.py --collect: what a plain step costs
# a head method's engine bare, and collecting every step (the premium C the closed-loop sim needs to decide
# specdec.engine.TIMED_BARE's default), medusa:2 and eagle3:3, batch 32, T = 0.8 seeded, e2e's completion prompts;
# then, if time is left, s51 call E's row traced (policy_steps.py: default auto beside --timed-bare).
# Everything is written under $OUT as it comes; later stages are bounded by DEADLINE (s).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS; DEADLINE=${DEADLINE:-575}
left() { echo $((DEADLINE - (SECONDS - t0) - 8)); }
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SHARDS=8 SHARD_THREADS=1 SUITE_LIMIT=${SUITE_LIMIT:-300} OUT=/tmp/gc bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
grep -v "^DEBUG" /tmp/gc.console | tail -14
tar czf $OUT/gc.tgz -C /tmp gc gc.console
echo "suite done at $((SECONDS - t0)) s"
mkdir -p $OUT/c1 && cd benchmarks
lim=$(left); [ $lim -gt 200 ] && lim=200
[ $lim -ge 40 ] && { timeout $lim python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods medusa:2 eagle3:3 \
  --batch 32 --temperature 0.8 --workload completion --prompts 64 --repeats ${REPEATS:-3} --collect --host-timers \
  > $OUT/c1/plain-collect.txt 2>&1; echo "== plain_overhead rc $? at $((SECONDS - t0)) s"; cat $OUT/c1/plain-collect.txt | cut -c1-250 | tail -60; }
lim=$(left); [ $lim -gt 150 ] && lim=150
[ $lim -ge 60 ] && { [ -d /tmp/rb/medusa ] || python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb', 'medusa')"
  timeout $lim python3 policy_steps.py --device cuda --model /tmp/rb/target --draft-model /tmp/rb/medusa \
  --method medusa:2 --batch 32 --temperature 0.8 --workload completion --prompts 64 --calls 99 --max-tokens 128 \
  --repeats 3 --timed-bare --trace $OUT/c1/trace.jsonl > $OUT/c1/t08.txt 2>&1
  echo "== policy_steps rc $? at $((SECONDS - t0)) s"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto)|by reason|^\| plain \| 32" $OUT/c1/t08.txt | cut -c1-300; gzip $OUT/c1/*.jsonl; }
echo "end at $((SECONDS - t0)) s"
