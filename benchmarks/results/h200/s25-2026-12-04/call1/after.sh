cd benchmarks
timeout 120 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b8 --batch 8 --prompts 16 --max-tokens 96 --repeats 2 --methods eagle3:3@fixed eagle3:3@auto > $OUT/b8.log 2>&1; echo "b8 rc $?"
grep "^| " $OUT/b8.md | cut -c1-200
python3 -c "
import json; d=json.load(open('$OUT/b8.json'))
for r in d['rows']:
    if r.get('policy')=='auto': print(r.get('workload'), r.get('policy_stats'), {k:(v.get('spec_switch_ms'),v.get('plain_switch_ms'),v.get('spec_over_plain')) for k,v in (r.get('policy_cost') or {}).items()})
"
timeout 50 python3 gpu_step_trace.py --model /tmp/bm/bench --head eagle3=/tmp/bm/bench-eagle3 --methods baseline eagle3:3 --option 'speculation_policy="auto"' --batch 8 --temperature 0 --host-timers --out $OUT/t > $OUT/trace.log 2>&1; echo "trace rc $?"
head -30 $OUT/t/host-eagle3-3.txt 2>/dev/null
