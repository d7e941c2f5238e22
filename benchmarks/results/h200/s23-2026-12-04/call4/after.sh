cd benchmarks
timeout 150 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b8 --batch 8 --prompts 16 --max-tokens 96 --repeats 1 --methods eagle3:3@fixed eagle3:3@auto eagle3:3@fixed+draft_sample_method=probabilistic > $OUT/b8.log 2>&1; echo "b8 rc $?"
grep "^| " $OUT/b8.md | cut -c1-210
timeout 40 python3 gpu_step_trace.py --random-bench /tmp/rb --methods baseline --batch 8 --temperature 0.8 --host-timers --out $OUT/t > $OUT/trace.log 2>&1; echo "trace rc $?"
head -4 $OUT/t/host-baseline.txt
timeout 90 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b1-trees --batch 1 --prompts 4 --max-tokens 128 --repeats 1 --methods eagle3:5@fixed eagle3:6@fixed+tree_top_k=8+tree_total_tokens=32 eagle3:5@fixed+tree_top_k=4+tree_total_tokens=16 > $OUT/b1-trees.log 2>&1; echo "b1-trees rc $?"
grep "^| " $OUT/b1-trees.md | cut -c1-200
