# s47 call 2 (what ~250 s of device time allows): the fused kernels' CUDA tests (s46's few-row head kernel compiled
# for the first time), then eagle's CUDA tests with head steps of up to 16 rows through it (HEAD_ROWS 16).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/eagle -e plugins/draft_model > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 60 python3 -m pytest -q -p no:cacheprovider -rs tests/plugins/draft_model/test_fused.py > $OUT/fused.log 2>&1
echo "fused at $((SECONDS - t0)) s: $(tail -1 $OUT/fused.log)"; grep "^FAILED\|^ERROR" $OUT/fused.log | head
timeout 110 python3 -c "import sys, pytest, specdec_eagle.chain as c; c.HEAD_ROWS = 16; sys.exit(pytest.main(sys.argv[1:]))" \
  -q -p no:cacheprovider -rs tests/plugins/eagle/test_eagle_graph_chain.py tests/plugins/eagle/test_eagle_graph_tree.py \
  tests/plugins/eagle/test_eagle_tree.py -k cuda > $OUT/rows16.log 2>&1
echo "rows-16 eagle at $((SECONDS - t0)) s: $(tail -1 $OUT/rows16.log)"; grep "^FAILED\|^ERROR" $OUT/rows16.log | head
