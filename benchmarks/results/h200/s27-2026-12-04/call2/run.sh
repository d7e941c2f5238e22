# measure only (no suite): where eagle3@auto's time goes at batch 8 when plain wins (random head)
set -x
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb','eagle3'))" > $OUT/rb.log 2>&1; echo "rb rc $?"
for T in 0 0.8; do for W in completion repeated; do
timeout 100 python3 policy_steps.py --device cuda --model /tmp/rb/target --draft-model /tmp/rb/eagle3 --method eagle3:3 --batch 8 --prompts 16 --max-tokens 96 --temperature $T --workload $W --repeats 3 > $OUT/ps-$W-$T.log 2>&1; echo "ps $W $T rc $?"
grep -v "Loading\|Warning\|warn" $OUT/ps-$W-$T.log | tail -22 | cut -c1-1500
done; done
