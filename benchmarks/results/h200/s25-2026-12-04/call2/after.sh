cd benchmarks
timeout 110 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b8 --batch 8 --prompts 16 --max-tokens 96 --repeats 2 --methods eagle3:3@fixed eagle3:3@auto > $OUT/b8.log 2>&1; echo "b8 rc $?"
grep "^| " $OUT/b8.md | cut -c1-250
python3 -c "
import json; d=json.load(open('$OUT/b8.json'))
for r in d['rows']:
    print(r['workload'], r['method'], [round(x*1e3,1) for x in r['seconds']])
    if r.get('policy')=='auto': print(r.get('policy_stats'), {k:(v.get('spec_switch_ms'),v.get('plain_switch_ms'),v.get('spec_over_plain')) for k,v in (r.get('policy_cost') or {}).items()})
"
timeout 40 python3 gpu_step_trace.py --model /tmp/bm/bench --head eagle3=/tmp/bm/bench-eagle3 --methods eagle3:5 --batch 1 --host-timers --out $OUT/tc > $OUT/trace-chain.log 2>&1; echo "chain trace rc $?"
head -40 $OUT/tc/host-eagle3-5.txt
timeout 45 python3 gpu_step_trace.py --model /tmp/bm/bench --head eagle3=/tmp/bm/bench-eagle3 --methods eagle3:5 --option tree_top_k=8 --option tree_total_tokens=32 --batch 1 --host-timers --out $OUT/tt > $OUT/trace-tree.log 2>&1; echo "tree trace rc $?"
head -40 $OUT/tt/host-eagle3-5.txt
