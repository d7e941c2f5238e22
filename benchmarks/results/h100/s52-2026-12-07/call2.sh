# s52 call 2 (call 1's warm machine, 53 s, the session's last device seconds): the CUDA test files of call 1's two
# shards that its 200 s limit cut short (shards 1 and 5), those that drive CUDA paths, each file in its own process
# beside the others, 70 s each at most.
export PYTHONPATH=$PWD/.device-pkgs; mkdir -p $OUT/r
for f in tests/core/test_tree_deferred.py tests/plugins/medusa/test_medusa.py tests/plugins/eagle/test_eagle_catch_up.py \
    tests/plugins/dflash/test_dflash.py tests/core/test_metadata.py tests/core/test_token_buffer.py \
    tests/plugins/draft_model/test_draft_model.py; do
  n=$(basename $f .py)
  (OMP_NUM_THREADS=2 timeout 70 python3 -m pytest -q -p no:cacheprovider -x $f > $OUT/r/$n.log 2>&1; echo "rc $?" >> $OUT/r/$n.log) &
done
wait; for f in $OUT/r/*.log; do echo "$(basename $f): $(tail -2 $f | tr '\n' ' ')"; done
