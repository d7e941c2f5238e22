set -x
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb','eagle3'))" 2>&1 | tail -1
timeout 100 python3 recompute_profile.py --random-bench /tmp/rb --out $OUT/rp > $OUT/recompute.log 2>&1; echo "recompute rc $?"
grep -v "Loading\|Capturing\|Writing" $OUT/recompute.log | head -75
timeout 60 python3 gpu_step_trace.py --random-bench /tmp/rb --methods eagle3:5 --option tree_top_k=8 --option tree_total_tokens=32 --out $OUT/trace-tree > $OUT/trace-tree.log 2>&1; echo "tree trace rc $?"
grep -v "Loading\|Capturing\|Writing" $OUT/trace-tree.log | head -40
timeout 45 python3 gpu_step_trace.py --random-bench /tmp/rb --methods eagle3:5 --out $OUT/trace-chain > $OUT/trace-chain.log 2>&1; echo "chain trace rc $?"
grep -v "Loading\|Capturing\|Writing" $OUT/trace-chain.log | head -25
