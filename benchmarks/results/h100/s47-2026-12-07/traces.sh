# s47, after the suite: s46's rewritten few-row head kernel (HEAD_ROWS 16) against head rows on cuBLAS and torch
# steps (1, the default), random-init bench-shaped pair, greedy, 96 tokens: eagle3 tree k=6 / top-8 / 32 nodes and
# chain k=3 at batch 8; eagle's tree tests with HEAD_ROWS 16; medusa's default tree with keep_paths per slot (4)
# against one gather and scatter (0).
T="timeout ${EACH:-40} python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
t0=$SECONDS
d=$OUT/trace; mkdir -p $d
timeout 100 python3 -c "import sys, pytest, specdec_eagle.chain as c; c.HEAD_ROWS = 16; sys.exit(pytest.main(sys.argv[1:]))" \
  -q -p no:cacheprovider -rs tests/plugins/eagle/test_eagle_graph_chain.py tests/plugins/eagle/test_eagle_graph_tree.py \
  tests/plugins/eagle/test_eagle_tree.py -k cuda > $d/rows16-tests.log 2>&1
echo "rows-16 tests rc $? at $((SECONDS - t0)) s: $(tail -1 $d/rows16-tests.log)"; grep "^FAILED\|^ERROR" $d/rows16-tests.log | head
for r in 16 1; do
  $T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 --head-rows $r --out $d/tree-r$r > $d/tree-r$r.log 2>&1
  $T --methods eagle3:3 --batch 8 --head-rows $r --out $d/chain8-r$r > $d/chain8-r$r.log 2>&1
  echo "rows $r at $((SECONDS - t0)) s"
done
for f in 4 0; do
  $T --methods medusa:3 --option 'tree_choices="default"' --few-slot-moves $f --out $d/mtree-f$f > $d/mtree-f$f.log 2>&1
done
echo "medusa at $((SECONDS - t0)) s"
find $d -name "trace-*.json.gz" -delete
for f in $d/*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels\|_row\|Error\|passed\|failed" $f | cut -c1-130; done
