# s45 call 5: the CUDA suite's two failures of call 3 (test_sampled_chain_drafts_equal_module_path[eagle], a CPU-path
# tolerance, loosened) and every tree test file again on the final tree; then the tree step's cost by shape on the
# random bench pair (profiled: kernels a step; best unprofiled tok/s a step of one token; SHAPES="k-topk-nodes ...",
# CHAINS="eagle3:5 ..." for more, the session's device time allowed one shape); host timers
# of the k=6 tree (its features now copied slice by slice).
t0=$SECONDS
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
python3 -m pip install -q --no-deps --no-build-isolation tests/fixtures/specdec-plugin-* >> $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/plugins/eagle/test_eagle_chain.py \
  tests/plugins/eagle/test_eagle_graph_tree.py tests/plugins/eagle/test_eagle_tree.py tests/plugins/medusa/test_medusa_tree.py \
  tests/core/test_tree_forward.py tests/core/test_tree_deferred.py tests/core/test_tree_engine.py \
  tests/plugins/draft_model/test_fused.py > $OUT/tests.log 2>&1
echo "tests rc $? at $((SECONDS - t0)) s"; tail -3 $OUT/tests.log
T="timeout 45 python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
for shape in ${SHAPES:-6-8-32}; do
  set -- ${shape//-/ }
  $T --methods eagle3:$1 --option tree_top_k=$2 --option tree_total_tokens=$3 --out $OUT/t$1-$2-$3 \
    > $OUT/tree-$1-$2-$3.log 2>&1; echo "tree $shape rc $? at $((SECONDS - t0)) s"
done
[ -n "${CHAINS:-}" ] && { $T --methods $CHAINS --out $OUT/chains > $OUT/chains.log 2>&1; echo "chains rc $? at $((SECONDS - t0)) s"; }
$T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 --host-timers --out $OUT/ht \
  > $OUT/host-tree.log 2>&1; echo "host tree rc $? at $((SECONDS - t0)) s"; grep -A 12 "===" $OUT/host-tree.log | cut -c1-100
find $OUT -name "trace-*.json.gz" -delete
for f in $OUT/tree-*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels" $f | cut -c1-150; done
