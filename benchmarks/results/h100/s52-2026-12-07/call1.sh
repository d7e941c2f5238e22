# s52 call 1 (fresh machine, ~400 s): the whole CUDA suite in 8 shards on this session's library; the policy's host
# time by kind of step on this host (policy_host.py --by-step, s51's policy beside); then s51 call E's row on a random
# bench-shaped pair (gpu_eagle_profile.random_bench: 4 random medusa heads; medusa:2, batch 32, T = 0.8 seeded,
# completion, the workload a pass), traced: this library's auto (a re-measurement burst's later plain steps read no
# request's estimates: _Bucket.burst_unread) beside an auto engine whose timed plain steps go bare (--timed-bare:
# specdec.engine.TIMED_BARE, off by default); OLD_RUN=1 also runs s51's library (.old-tree: 147274b, first on
# PYTHONPATH) in its own process (s51's call E is that row on another H100). Everything is written under $OUT as it comes (a cut call keeps what it had).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SHARDS=8 SHARD_THREADS=1 SUITE_LIMIT=${SUITE_LIMIT:-240} OUT=/tmp/gc bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
grep -v "^DEBUG" /tmp/gc.console | tail -14
tar czf $OUT/gc.tgz -C /tmp gc gc.console
echo "suite done at $((SECONDS - t0)) s"
mkdir -p $OUT/c1 && cd benchmarks
timeout 30 python3 policy_host.py --by-step --batch 8 32 --steps 10000 --old ../.old-tree/core/specdec/policy.py \
  > $OUT/c1/policy-host.md 2>&1
cat $OUT/c1/policy-host.md
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb', 'medusa'))" > $OUT/c1/rb.log 2>&1
OLD="$PWD/../.old-tree/core:$PWD/../.old-tree/plugins/medusa:"
for v in new $([ "${OLD_RUN:-0}" = 1 ] && echo old); do
  P="" X="--timed-bare"; [ $v = old ] && P="$OLD" X=""
  lim=$([ $v = new ] && echo ${STEPS_LIMIT:-150} || echo 110); left=$((${DEADLINE:-9999} - (SECONDS - t0) - 8))
  [ $left -lt $lim ] && lim=$left; [ $lim -lt 40 ] && { echo "== $v skipped: $lim s left"; continue; }
  PYTHONPATH="$P$PYTHONPATH" timeout $lim python3 policy_steps.py --device cuda \
    --model /tmp/rb/target --draft-model /tmp/rb/medusa --method medusa:2 --batch 32 --temperature 0.8 \
    --workload completion --prompts 64 --calls 99 --max-tokens 128 --repeats ${REPEATS:-3} $X --trace $OUT/c1/trace-$v.jsonl \
    > $OUT/c1/t08-$v.txt 2>&1
  echo "== $v rc $? at $((SECONDS - t0)) s"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto)|by reason|^\| plain \| 32" $OUT/c1/t08-$v.txt | cut -c1-300
done
gzip $OUT/c1/*.jsonl
