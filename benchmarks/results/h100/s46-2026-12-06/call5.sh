# s46 call 5 (what the device time left allows, ~150 s): call 4 cut down: the fused kernels' CUDA test (the few-row
# kernel included), then the eagle3 tree and the batch-8 chain with head steps through it (16) and without (1).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/eagle -e plugins/draft_model > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 40 python3 -m pytest -q -p no:cacheprovider -rs tests/plugins/draft_model/test_fused.py -k cuda > $OUT/tests.log 2>&1
echo "tests at $((SECONDS - t0)) s: $(tail -1 $OUT/tests.log)"; grep "^FAILED\|^E  " $OUT/tests.log | head -5
T="timeout 45 python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb"
d=$OUT/trace; mkdir -p $d
for r in 16 1; do
  $T --methods eagle3:6 --option tree_top_k=8 --option tree_total_tokens=32 --head-rows $r --out $d/tree-r$r > $d/tree-r$r.log 2>&1
  $T --methods eagle3:3 --batch 8 --head-rows $r --out $d/chain8-r$r > $d/chain8-r$r.log 2>&1
  echo "rows $r at $((SECONDS - t0)) s"
done
find $d -name "trace-*.json.gz" -delete
for f in $d/*.log; do echo "## $f"; grep -h "===\|decode steps:\|device kernels\|_row\|Error" $f | cut -c1-130; done
