# eagle's CUDA tests with head steps of up to 16 rows through specdec_eagle.chain's few-row kernel (HEAD_ROWS 16).
python3 -c "import sys, pytest, specdec_eagle.chain as c; c.HEAD_ROWS = 16; sys.exit(pytest.main(sys.argv[1:]))" \
  -q -p no:cacheprovider -rs tests/plugins/eagle/test_eagle_graph_chain.py tests/plugins/eagle/test_eagle_graph_tree.py \
  tests/plugins/eagle/test_eagle_tree.py -k cuda 2>&1 | grep -v "^DEBUG"
