# s41 call 1: where a batch-8 drafting step's wall time goes (profiler: device busy against idle, idle by host
# function; random bench-shaped pair, every step drafting) for the baseline, ngram and eagle3, then the whole CUDA
# suite on whatever card comes.
export PYTHONPATH=$PWD/.device-pkgs
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /dev/null 2>&1
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb')" > $OUT/rb.log 2>&1
timeout ${TRACE_LIMIT:-150} python3 gpu_step_trace.py --random-bench /tmp/rb --methods baseline ngram:4 eagle3:3 \
  --batch 8 --max-tokens 96 --out $OUT/trace-b8 > $OUT/trace-b8.txt 2>&1
echo "trace rc $?"; grep -E "^===|busy|idle" $OUT/trace-b8.txt | head -20
timeout ${HT_LIMIT:-80} python3 gpu_step_trace.py --random-bench /tmp/rb --methods baseline ngram:4 eagle3:3 \
  --batch 8 --max-tokens 96 --host-timers --out $OUT/timers-b8 > $OUT/timers-b8.txt 2>&1
echo "timers rc $?"
cd ..
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=300 OUT=/tmp/gc bash benchmarks/gpu_check.sh > $OUT/suite-console.log 2>&1
tail -9 $OUT/suite-console.log
tar czf $OUT/gc.tgz -C /tmp gc
