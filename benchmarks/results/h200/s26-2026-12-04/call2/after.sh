set -x
cd benchmarks
timeout 40 python3 gpu_step_trace.py --model /tmp/bm/bench --head eagle3=/tmp/bm/bench-eagle3 --methods eagle3:5 --option tree_top_k=8 --option tree_total_tokens=32 --batch 1 --host-timers --out $OUT/tt > $OUT/trace-tree.log 2>&1; echo "tree trace rc $?"
head -36 $OUT/tt/host-eagle3-5.txt
timeout 32 python3 gpu_step_trace.py --model /tmp/bm/bench --head eagle3=/tmp/bm/bench-eagle3 --methods eagle3:5 --batch 1 --host-timers --out $OUT/tc > $OUT/trace-chain.log 2>&1; echo "chain trace rc $?"
head -16 $OUT/tc/host-eagle3-5.txt
timeout 70 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b1-trees --batch 1 --prompts 4 --max-tokens 128 --repeats 1 --workloads completion repeated --methods eagle3:5@fixed eagle3:6@fixed+tree_top_k=8+tree_total_tokens=32 eagle3:5@fixed+tree_top_k=4+tree_total_tokens=16 > $OUT/b1-trees.log 2>&1; echo "b1 trees rc $?"
grep "^| " $OUT/b1-trees.md | cut -c1-220
timeout 55 python3 stall_watch.py --threshold-ms 12 --out $OUT/stalls.json -- --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name stall --batch 8 --prompts 16 --max-tokens 96 --repeats 2 --workloads completion --methods eagle3:3@auto > $OUT/stall.log 2>&1; echo "stall watch rc $?"
grep -A60 "watched calls over" $OUT/stall.log | cut -c1-260 | head -70
