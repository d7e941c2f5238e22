# s53 call 2 (call 1's warm machine): the end rule's shrinking batch (ba03233) against the rule before it
# (policy_before.py = df1e40b's policy.py) in the same passes, on the GPU: ngram:4 on the bundled tiny model, e2e's
# completion prompts, T = 0, batch 8 and 32 (2x the batch in one call a pass), policy_steps.py. First, here:
#   git show df1e40b:core/specdec/policy.py > benchmarks/results/h100/s53-2026-12-07/policy_before.py  (not committed)
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
mkdir -p $OUT/c2; cd benchmarks; P=$PWD/results/h100/s53-2026-12-07/policy_before.py
for b in 8 32; do
  timeout ${LIM:-200} python3 policy_steps.py --device cuda --method ngram:4 --workload completion --temperature 0 \
    --batch $b --prompts $((2 * b)) --calls 2 --max-tokens 96 --repeats 3 --policy-file $P --no-end-rule \
    > $OUT/c2/ngram-b$b.txt 2>&1
  echo "== b$b rc $?"; grep -A7 "^| engine" $OUT/c2/ngram-b$b.txt | cut -d'|' -f2-5; grep "by reason\|cost table" $OUT/c2/ngram-b$b.txt | cut -c1-400
done
