# s45 call 6 (the device time left, ~290 s with the start): call 5 cut down: the CUDA tests of the session's last GPU
# change (the tree step's features copied slice by slice) and of the suite's two failures, then the tree's host timers.
t0=$SECONDS
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/plugins/eagle/test_eagle_graph_tree.py \
  tests/plugins/eagle/test_eagle_tree.py tests/plugins/eagle/test_eagle_chain.py tests/plugins/medusa/test_medusa_tree.py \
  > $OUT/tests.log 2>&1
echo "tests rc $? at $((SECONDS - t0)) s"; tail -4 $OUT/tests.log
timeout 40 python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb --methods eagle3:6 --option tree_top_k=8 \
  --option tree_total_tokens=32 --host-timers --out $OUT/ht > $OUT/host-tree.log 2>&1
echo "host tree rc $? at $((SECONDS - t0)) s"; grep -A 14 "===" $OUT/host-tree.log | cut -c1-100
