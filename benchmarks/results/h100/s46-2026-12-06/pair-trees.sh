# s46 (planned, not run: no device time) one call, a fresh machine is fine: the trained bench pair (pair.sh: target, eagle3 and medusa heads),
# then issue 25 at batch 1 on completion: eagle3 chain k=5 against its tree (k=6, top-8, 32 nodes), medusa's chain
# against its default tree, suffix's chain against its tree (2 passes, 4 prompts, 128 tokens).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
OUT=$OUT bash benchmarks/results/h100/s46-2026-12-06/pair.sh
left=$((585 - (SECONDS - t0)))
echo "e2e with $left s left"
timeout $left python3 benchmarks/e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
  --temperature 0 --method-option eagle3.model=/tmp/bm/bench-eagle3 --method-option medusa.model=/tmp/bm/bench-medusa \
  --out $OUT --batch 1 --workloads completion --prompts 4 --max-tokens 128 --repeats 2 --name b1-trees \
  --methods eagle3:5@fixed eagle3:6@fixed+tree_top_k=8+tree_total_tokens=32 medusa:3@fixed \
  medusa:3@fixed+tree_choices=default suffix@fixed suffix@fixed+use_tree_spec=true > $OUT/b1-trees.log 2>&1
echo "b1-trees rc $? at $((SECONDS - t0)) s"; grep -E "^\| completion " $OUT/b1-trees.md | cut -c1-140
