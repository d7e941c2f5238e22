# after the suite, on a random bench-shaped target (no build): ngram@auto at T = 0.8, batch 32 (it never drafts there)
set -x
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb', 'eagle3')" > $OUT/rb.log 2>&1; echo "random bench rc $?"
for b in 32 1; do
  timeout 45 python3 policy_steps.py --device cuda --model /tmp/rb/target --method ngram:4 --batch $b --prompts $((b * 2)) --max-tokens 64 --temperature 0.8 --repeats 3 > $OUT/ngram-b$b.log 2>&1; echo "policy_steps b$b rc $?"
  head -1 $OUT/ngram-b$b.log; grep -A4 "^| engine" $OUT/ngram-b$b.log
done
timeout 40 python3 plain_profile.py --device cuda --model /tmp/rb/target --method ngram:4 --batch 32 --prompts 64 --max-tokens 64 --temperature 0.8 --top 25 > $OUT/plain-profile.log 2>&1; echo "profile rc $?"
tail -28 $OUT/plain-profile.log
