# s46 call 4: the few-row kernel rewritten after call 2's traces (rows summed together against each weight tile,
# not one after another: that form cost 14.5 us a launch against cuBLAS's 4): the CUDA tests of the changed code,
# then the head-rows traces again (16 against 1) and medusa's tree against its chain.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
python3 -m pip install -q --no-deps --no-build-isolation tests/fixtures/specdec-plugin-* >> $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
# the eagle tests with head steps of up to 16 rows through the few-row kernel (HEAD_ROWS 16, its default 1)
timeout 130 python3 -c "import sys, pytest, specdec_eagle.chain as c; c.HEAD_ROWS = 16; sys.exit(pytest.main(sys.argv[1:]))" \
  -q -p no:cacheprovider -rs tests/plugins/draft_model/test_fused.py \
  tests/plugins/eagle/test_eagle_graph_chain.py tests/plugins/eagle/test_eagle_graph_tree.py \
  tests/plugins/eagle/test_eagle_tree.py tests/plugins/eagle/test_eagle_chain.py tests/core/test_tree_forward.py \
  tests/core/test_tree_deferred.py tests/plugins/medusa/test_medusa_tree.py > $OUT/tests.log 2>&1 || true
echo "tests at $((SECONDS - t0)) s: $(tail -1 $OUT/tests.log)"; grep "^FAILED\|^ERROR" $OUT/tests.log | head
T="timeout 40 python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
d=$OUT/trace; mkdir -p $d
for r in 16 1; do
  $T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 --head-rows $r --out $d/tree-r$r > $d/tree-r$r.log 2>&1
  $T --methods eagle3:3 --batch 8 --head-rows $r --out $d/chain8-r$r > $d/chain8-r$r.log 2>&1
  echo "rows $r at $((SECONDS - t0)) s"
done
for f in 4 0; do  # keep_paths per slot (4) against one gather and scatter (0)
  $T --methods medusa:3 --option 'tree_choices="default"' --few-slot-moves $f --out $d/mtree-f$f > $d/mtree-f$f.log 2>&1
done
echo "medusa at $((SECONDS - t0)) s"
find $d -name "trace-*.json.gz" -delete
for f in $d/*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels\|_row\|Error" $f | cut -c1-130; done
