# s45 call 3 (one call for both, the device being scarce): call 1's profiled runs (trees new / old, chains), then the
# whole CUDA suite (call 2) in the time left.
t0=$SECONDS
export PYTHONPATH=$PWD/.device-pkgs
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
T="timeout ${EACH:-45} python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
d=$OUT/trace
for v in new old; do
  P=""; O=""; [ $v = old ] && P="$PWD/.old-tree/eagle:$PWD/.old-tree/medusa:" && O="--torch-tree-step"
  PYTHONPATH="$P$PYTHONPATH" $T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 $O \
    --out $d/tree-$v > $d-tree-$v.log 2>&1; echo "tree $v rc $? at $((SECONDS - t0)) s"
  PYTHONPATH="$P$PYTHONPATH" $T --methods medusa:3 --option 'tree_choices="default"' $O --out $d/mtree-$v \
    > $d-mtree-$v.log 2>&1; echo "mtree $v rc $? at $((SECONDS - t0)) s"
done
$T --methods eagle3:5 medusa:3 --out $d/chain > $d-chain.log 2>&1; echo "chain rc $? at $((SECONDS - t0)) s"
find $OUT -name "trace-*.json.gz" -delete
for f in $OUT/*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels\|Error" $f | cut -c1-160; done
left=$((580 - (SECONDS - t0)))
echo "suite with $left s left"
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=$((left - 40)) OUT=/tmp/gc bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
tar czf $OUT/gc.tgz -C /tmp gc gc.console
tail -5 /tmp/gc.console
