# after call 1 of the plan (suite + the trained bench pair in /tmp/bm): the end-rule experiment's two forms against
# the library's rule on the H200, ngram and eagle-free methods at batch 8 (same process each)
[ -f /tmp/bm/bench/config.json ] || { echo "no /tmp/bm/bench: a fresh machine"; exit 3; }
export PYTHONPATH=$PWD/.device-pkgs
cd benchmarks
for rule in scheduled chains; do
  timeout ${LIMIT:-120} python3 end_rule.py --device cuda --model /tmp/bm/bench --method ngram:4 --batch 8 \
    --temperature 0 0.8 --workload completion edit repeated --repeats 6 --rule $rule > $OUT/end-rule-$rule.log 2>&1
  echo "end_rule $rule rc $?"; tr '\r' '\n' < $OUT/end-rule-$rule.log | grep "^| \(completion\|edit\|repeated\)\|passes"
done
