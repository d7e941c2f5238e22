# issue 24: where auto's mostly-plain rows lose ~13-16% at batch 8 on the GPU (s34 grid: ngram@auto T = 0.8
# repeated 0.87x with 2% of steps drafting, the policy's bucket-8 plain step ~ the baseline's step): the same
# engines with every step forced plain, then with the policy left as its warm-up pass left it; host timers
# (us a decode step per function, calls of _queue_ahead / _take_ahead / _prefill) side by side with the baseline
export PYTHONPATH=$PWD/.device-pkgs
cd benchmarks
for mode in forced natural; do
  flag=""; [ $mode = natural ] && flag="--natural"
  timeout ${LIMIT:-150} python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods ngram:4 eagle3:3 \
    --batch 8 --temperature 0.8 0 --workload repeated --prompts 64 --max-tokens 128 --repeats 3 --host-timers $flag \
    --out $OUT/diag-$mode.json > $OUT/diag-$mode.log 2>&1
  echo "$mode rc $?"
  grep -v "Loading\|Writing" $OUT/diag-$mode.log | head -60
done
