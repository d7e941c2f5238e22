# s48 calls B-F as run on the warm machine after call A (each its own device call; /tmp/bm from call A).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
# B: the heads (pair.sh without its zoo line, the target being /tmp/bm itself), then issue 25's batch-1 rows
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /dev/null 2>&1
ln -sfn /tmp/bm /tmp/bm/bench; sed '/specdec.zoo/d' benchmarks/results/h100/s46-2026-12-06/pair.sh > /tmp/heads.sh
OUT=$OUT bash /tmp/heads.sh; TOTAL=395 bash benchmarks/results/h200/s48-2026-12-07/callB.sh
E="python3 benchmarks/e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0
   --out $OUT --batch 32 --prompts 64 --max-tokens 64 --method-option medusa.model=/tmp/bm/bench-medusa --workloads completion"
# C
timeout 280 $E --repeats 2 --method-option eagle3.model=/tmp/bm/bench-eagle3 --name b32-trees --methods eagle3:3@fixed \
  eagle3:3@auto+tree_top_k=4+tree_total_tokens=16 medusa:2@fixed medusa:2@auto+tree_choices=default
# D
timeout 200 $E --repeats 4 --name b32-medusa --methods medusa:2@auto medusa:2@auto+tree_choices=default
# E, F
timeout 540 python3 benchmarks/target_sweep.py --sizes bench 1b 3b --batch 1 8 --hf --out $OUT/sweep
timeout 280 python3 benchmarks/target_sweep.py --sizes 8b --batch 1 8 --hf --out $OUT/sweep8
