set -x
cd benchmarks
timeout 95 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name b8 --batch 8 --prompts 16 --max-tokens 96 --repeats 2 --workloads completion repeated --methods eagle3:3@fixed eagle3:3@auto > $OUT/b8.log 2>&1; echo "b8 rc $?"
grep "^| " $OUT/b8.md | cut -c1-250
python3 -c "
import json; d=json.load(open('$OUT/b8.json'))
for r in d['rows']:
    print(r['workload'], r.get('temperature'), r['method'], [round(x*1e3,1) for x in r['seconds']])
    if r.get('policy')=='auto': print(r.get('policy_stats'), {k:(v.get('spec_switch_ms'),v.get('plain_switch_ms'),v.get('spec_over_plain')) for k,v in (r.get('policy_cost') or {}).items()})
"
timeout 100 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0 0.8 --out $OUT --name b32 --batch 32 --prompts 64 --max-tokens 64 --repeats 1 --workloads completion repeated --methods ngram@fixed ngram@auto suffix@fixed suffix@auto > $OUT/b32.log 2>&1; echo "b32 rc $?"
grep "^| " $OUT/b32.md | cut -c1-250
