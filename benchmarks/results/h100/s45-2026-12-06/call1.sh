# s45 call 1: token-tree steps before and after this session's changes (issue 25), random-init bench target and
# heads, batch 1, greedy, the old plugins (.old-tree/{eagle,medusa}: 744eb86's packages) in the same call: eagle3
# tree (k=6, top-k 8, 32 nodes) and medusa's default tree (k=3), new / old; eagle3 chain k=5 and medusa chain k=3;
# profiler (device kernels by family, idle time by host function), then host timers. Carry .old-tree. Old: also the
# torch tree-step tensors (--torch-tree-step).
export PYTHONPATH=$PWD/.device-pkgs
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
T="timeout ${EACH:-60} python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
for mode in "" "--host-timers"; do
  d=$OUT/${mode:+host}trace
  for v in new old; do
    P=""; O=""; [ $v = old ] && P="$PWD/.old-tree/eagle:$PWD/.old-tree/medusa:" && O="--torch-tree-step"
    PYTHONPATH="$P$PYTHONPATH" $T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 $mode $O \
      --out $d/tree-$v > $d-tree-$v.log 2>&1; echo "tree $v rc $?"
    PYTHONPATH="$P$PYTHONPATH" $T --methods medusa:3 --option 'tree_choices="default"' $mode $O --out $d/mtree-$v \
      > $d-mtree-$v.log 2>&1; echo "mtree $v rc $?"
  done
  $T --methods eagle3:5 medusa:3 $mode --out $d/chain > $d-chain.log 2>&1; echo "chain rc $?"
done
find $OUT -name "trace-*.json.gz" -delete
for f in $OUT/*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels\|Error" $f | cut -c1-200; done
