# s46: this session's change (eagle head steps of up to 16 rows through the fused row kernel) against the rows on
# cuBLAS and torch steps (--head-rows 1, the code before it), same run, random-init bench-shaped pair, greedy, 96
# tokens: eagle3 tree k=6 / top-8 / 32 nodes and chain k=5 at batch 1, chain k=3 at batch 8; profiled (kernels a
# step) and best unprofiled tok/s; medusa's default tree and chain (k=3) once each.
T="timeout ${EACH:-40} python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
t0=$SECONDS
d=$OUT/trace; mkdir -p $d
for rows in 16 1; do
  $T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 --head-rows $rows --out $d/tree-r$rows \
    > $d/tree-r$rows.log 2>&1; echo "tree rows $rows rc $? at $((SECONDS - t0)) s"
  $T --methods eagle3:5 --head-rows $rows --out $d/chain-r$rows > $d/chain-r$rows.log 2>&1
  echo "chain rows $rows rc $? at $((SECONDS - t0)) s"
  $T --methods eagle3:3 --batch 8 --head-rows $rows --out $d/chain8-r$rows > $d/chain8-r$rows.log 2>&1
  echo "chain b8 rows $rows rc $? at $((SECONDS - t0)) s"
done
$T --methods medusa:3 --option 'tree_choices="default"' --out $d/mtree > $d/mtree.log 2>&1
echo "medusa tree rc $? at $((SECONDS - t0)) s"
$T --methods medusa:3 --out $d/mchain > $d/mchain.log 2>&1; echo "medusa chain rc $? at $((SECONDS - t0)) s"
find $d -name "trace-*.json.gz" -delete
for f in $d/*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels\|Error" $f | cut -c1-160; done
