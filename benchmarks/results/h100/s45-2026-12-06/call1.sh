# s45 call 1: where a token-tree step's time goes today (issue 25), random-init bench target and heads, batch 1,
# greedy: eagle3 chain k=5 against a tree (k=6, top-k 8, 32 nodes), medusa chain k=3 against its default tree;
# profiler (device kernels by family, idle time by host function) then host timers.
export PYTHONPATH=$PWD/.device-pkgs
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
T="timeout ${EACH:-100} python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
for mode in "" "--host-timers"; do
  d=$OUT/${mode:+host}trace
  $T --methods baseline eagle3:5 medusa:3 $mode --out $d/chain > $d-chain.log 2>&1; echo "chain rc $?"
  $T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 $mode --out $d/tree > $d-tree.log 2>&1
  echo "tree rc $?"
  $T --methods medusa:3 --option 'tree_choices="default"' $mode --out $d/mtree > $d-mtree.log 2>&1; echo "mtree rc $?"
done
rm -f $OUT/trace/*/trace-*.json.gz
grep -h "===\|decode steps:\|device kernels" $OUT/*.log | cut -c1-220
