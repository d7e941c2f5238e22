# s47, one call (a fresh machine is fine; ~590 s): the trained bench pair (s46's pair.sh: target, eagle3 and medusa
# heads), then issue 25 at batch 1, greedy, in one e2e run each: on completion eagle3's chain (k=5) against its tree
# (k=6, top-k 8, 32 nodes) and medusa's chain (k=3) against its default tree; on repeated suffix's chain against its
# tree (issue 25 compares suffix there). 4 prompts, 128 tokens, 2 passes.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
# the pair from an earlier call on a warm machine, else built here (s46's pair.sh)
[ -f /tmp/bm/bench-medusa/config.json ] && [ -d /tmp/bm/bench-eagle3 ] || OUT=$OUT bash benchmarks/results/h100/s46-2026-12-06/pair.sh
ls /tmp/bm
E="python3 benchmarks/e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress --temperature 0
   --out $OUT --batch 1 --prompts 4 --max-tokens 128 --repeats 2"
T=${TOTAL:-588}  # seconds for the whole call (less where less device time is left)
left=$((T - 90 - (SECONDS - t0))); [ $left -lt 170 ] && left=$((T - (SECONDS - t0)))  # suffix gets what is left
echo "heads e2e with $left s left"
timeout $left $E --method-option eagle3.model=/tmp/bm/bench-eagle3 --method-option medusa.model=/tmp/bm/bench-medusa \
  --workloads completion --name b1-heads --methods eagle3:5@fixed eagle3:6@fixed+tree_top_k=8+tree_total_tokens=32 \
  medusa:3@fixed medusa:3@fixed+tree_choices=default > $OUT/b1-heads.log 2>&1
echo "b1-heads rc $? at $((SECONDS - t0)) s"; grep -E "^\| completion " $OUT/b1-heads.md | cut -c1-150
left=$((T - (SECONDS - t0)))
[ $left -gt 30 ] && timeout $left $E --workloads repeated --name b1-suffix --methods suffix@fixed suffix@fixed+use_tree_spec=true \
  suffix@fixed+use_tree_spec=true+tree_nodes=16 > $OUT/b1-suffix.log 2>&1
echo "b1-suffix rc $? at $((SECONDS - t0)) s"; grep -E "^\| repeated " $OUT/b1-suffix.md | cut -c1-150
