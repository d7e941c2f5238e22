# s45 call 1: a token-tree step before and after this session's change (issue 25), random-init bench target and
# heads, batch 1, greedy, with the old eagle plugin (.old-tree/eagle: 744eb86's specdec_eagle) in the same call:
# eagle3 tree (k=6, top-k 8, 32 nodes) new / old, eagle3 chain k=5, medusa chain k=3 and its default tree;
# profiler (device kernels by family, idle time by host function), then host timers. Carry .old-tree.
export PYTHONPATH=$PWD/.device-pkgs
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
T="timeout ${EACH:-75} python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
TREE="--methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32"
for mode in "" "--host-timers"; do
  d=$OUT/${mode:+host}trace
  for v in new old; do
    P=""; [ $v = old ] && P="$PWD/.old-tree/eagle:"
    PYTHONPATH="$P$PYTHONPATH" $T $TREE $mode --out $d/tree-$v > $d-tree-$v.log 2>&1; echo "tree $v rc $?"
  done
  $T --methods eagle3:5 medusa:3 $mode --out $d/chain > $d-chain.log 2>&1; echo "chain rc $?"
  [ -z "$mode" ] && { $T --methods medusa:3 --option 'tree_choices="default"' --out $d/mtree > $d-mtree.log 2>&1; echo "mtree rc $?"; }
done
find $OUT -name "trace-*.json.gz" -delete
for f in $OUT/*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels\|Error" $f | cut -c1-200; done
