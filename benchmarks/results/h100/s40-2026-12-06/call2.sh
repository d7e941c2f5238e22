# s40 call 2: (1) suffix's seeded plain step after 465ba4b (own trees built at a request's first draft), beside
# ngram's; (2) do mostly-plain auto rows lose at T = 0.8 with nothing to gain (random bench-shaped target and eagle3
# head: drafting never pays), in e2e's own passes (64 prompts x 128 tokens, batch 8, 5 passes)?
export PYTHONPATH=$PWD/.device-pkgs
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import specdec" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
cd benchmarks
[ -f /tmp/rb/target/config.json ] || python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb')" > $OUT/rb.log 2>&1
timeout 100 python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods suffix:4 ngram:4 \
  --batch 8 --temperature 0.8 --workload completion --prompts 64 --repeats 5 --out $OUT/plain-overhead-suffix.json \
  > $OUT/plain-overhead-suffix.txt 2>&1
echo "plain_overhead rc $?"; grep -E "plain-only" $OUT/plain-overhead-suffix.txt
timeout ${E2E_LIMIT:-300} python3 e2e.py --device cuda --model /tmp/rb/target --no-peers --no-plots --no-progress \
  --temperature 0.8 --method-option eagle3.model=/tmp/rb/eagle3 --out $OUT --name rb-plain-b8 --batch 8 \
  --prompts 64 --max-tokens 128 --repeats 5 --workloads completion edit \
  --methods eagle3:3@auto ngram:4@auto suffix:4@auto > $OUT/rb-plain-b8.log 2>&1
echo "e2e rc $?"
python3 auto_table.py $OUT/rb-plain-b8.json 2>&1 | tail -12
python3 - $OUT/rb-plain-b8.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    ps = r.get("policy_stats", {})
    print(r["workload"], r["method"], " ".join(f"{x:.4f}" for x in r["seconds"]), round(r["speedup"], 3),
          ps.get("drafted_step_share"), {k: v for k, v in ps.items() if k.startswith("plain_") and v})
PY
