cd benchmarks
timeout 40 python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods eagle3:3 --batch 8 --temperature 0 --repeats 3 --out $OUT/po-short.json > $OUT/po-short.log 2>&1; echo "short rc $?"
grep "plain-only" $OUT/po-short.log | sed 's/.*batch/batch/'
timeout 50 python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods eagle3:3 --batch 8 --temperature 0 --workload repeated --prompts 24 --repeats 3 --host-timers --out $OUT/po-repeated.json > $OUT/po-repeated.log 2>&1; echo "repeated rc $?"
grep -v -e Capturing -e Loading $OUT/po-repeated.log | sed 's/.*batch 8/batch 8/' | head -16
timeout 60 python3 e2e.py --device cuda --model /tmp/rb/target --no-peers --no-plots --no-progress --temperature 0 --method-option eagle3.model=/tmp/rb/eagle3 --out $OUT --name rb8 --batch 8 --prompts 16 --max-tokens 96 --repeats 2 --workloads edit repeated --methods eagle3:3@auto > $OUT/rb8.log 2>&1; echo "rb8 rc $?"
grep "^| " $OUT/rb8.md | cut -c1-230
