cd benchmarks
timeout 110 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b8 --batch 8 --prompts 16 --max-tokens 96 --repeats 1 --methods eagle3:3@fixed eagle3:3@auto > $OUT/b8.log 2>&1; echo "b8 rc $?"
grep "^| " $OUT/b8.md | cut -c1-200
timeout 80 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 --method-option eagle3.model=/tmp/bm/bench-eagle3 --method-option medusa.model=/tmp/bm/bench-medusa --out $OUT --name b1 --batch 1 --prompts 4 --max-tokens 128 --repeats 1 --methods eagle3:5@fixed eagle3:5@auto medusa:3@auto > $OUT/b1.log 2>&1; echo "b1 rc $?"
grep "^| " $OUT/b1.md | cut -c1-200
