# s51 call C (fresh machine, ~500 s): the whole CUDA suite in 8 shards on this session's final library (call B's
# suite ran before its test fixes and before medusa's last-position recompute), then medusa's switch out of a bare
# run, old against new: a random bench-shaped pair (gpu_eagle_profile.random_bench: medusa's 4 random heads accept
# nothing, so drafting never pays), batch 32, T = 0, e2e's completion workload a pass (--calls 99), auto against
# the baseline and fixed k in one process; s50's library (.old-tree, 1854586: every bare position recomputed at a
# switch) then this one (the last position alone).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
SHARDS=8 SHARD_THREADS=1 SUITE_LIMIT=${SUITE_LIMIT:-300} OUT=/tmp/gc bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
grep -v "^DEBUG" /tmp/gc.console | tail -22
tar czf $OUT/gc.tgz -C /tmp gc gc.console
mkdir -p /tmp/cC && cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb', 'medusa'))" > /tmp/cC/rb.log 2>&1
tail -1 /tmp/cC/rb.log
OLD="$PWD/../.old-tree/core:$PWD/../.old-tree/plugins/medusa:"
for v in old new; do
  P=""; [ $v = old ] && P="$OLD"
  PYTHONPATH="$P$PYTHONPATH" timeout ${LIMIT:-100} python3 policy_steps.py --device cuda --model /tmp/rb/target \
    --draft-model /tmp/rb/medusa --method medusa:2 --batch 32 --temperature 0 --workload completion --prompts 64 \
    --calls 99 --max-tokens 128 --repeats ${REPEATS:-4} > /tmp/cC/steps-$v.txt 2>&1
  echo "== $v rc $?"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto) |by reason|cost table|^  (baseline|fixed|auto):" /tmp/cC/steps-$v.txt | cut -c1-900 | head -20
done
tar czf $OUT/cC.tgz -C /tmp cC
