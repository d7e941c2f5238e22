# issue 24, s36: the end rule's estimate, old (HEAD before s36: least of the fast per-request averages) against new
# (empirical Bayes over the batch, end_gains; a switch owed only by requests behind), 5 seeds a scenario
git show 823a2f5:core/specdec/policy.py > /tmp/old_policy.py
for scen in "--acc 0.95 0.9 0.85" "--acc 0.9 0.85 0.8" "--acc 0.9 0.8 0.7" "--acc 0.95 0.9 0.85 --spread 0.2" \
    "--acc 0.95 0.9 0.85 --dud 0.125" "--acc 0.8 0.6 0.4 --spec-ms 0.9" "--acc 0.6 0.4 0.3 --spec-ms 0.9" \
    "--acc 0.8 0.6 0.4 --spec-ms 0.9 --dud 0.2" "--acc 0.9 0.85 0.8 --switch-ms 2" \
    "--acc 0.9 0.85 0.8 --batch 32 --per-call 32 --calls 16" "--acc 0.95 0.9 0.85 --per-call 64 --calls 8"; do
  for seed in 0 1 2 3 4; do
    echo "## $scen --seed $seed"
    python benchmarks/policy_calls_sim.py --old /tmp/old_policy.py $scen --seed $seed
  done
done
