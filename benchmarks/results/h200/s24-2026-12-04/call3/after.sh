cd benchmarks
timeout 105 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b8 --batch 8 --prompts 16 --max-tokens 96 --repeats 1 --methods eagle3:3@fixed eagle3:3@auto > $OUT/b8.log 2>&1; echo "b8 rc $?"
grep "^| " $OUT/b8.md | cut -c1-200
timeout 60 python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods eagle3:3 medusa:3 dflash:4 --batch 1 8 --temperature 0 0.8 --max-tokens 96 --repeats 5 --out $OUT/plain.json > $OUT/plain.log 2>&1; echo "plain rc $?"
grep "plain-only" $OUT/plain.log
