# measure only: is the recompute's cost a first call in a process, or every new shape? the engine's warm-up and the
# time-capped gap (random eagle3 head); ngram@auto at batch 32, T = 0.8 on the trained bench target (call 1: 0.44x)
set -x
t0=$SECONDS
( python3 -m specdec.zoo --preset bench --out /tmp/bm/bench --device cuda > $OUT/build.log 2>&1; echo "build rc $? at $((SECONDS-t0)) s" ) &
BUILD=$!
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb','eagle3'))" > $OUT/rb.log 2>&1; echo "rb rc $?"
timeout 60 python3 recompute_first.py --random-bench /tmp/rb > $OUT/first-cold.log 2>&1; echo "cold rc $?"; grep "ms" $OUT/first-cold.log | grep -v Loading | tail -2
timeout 60 python3 recompute_first.py --random-bench /tmp/rb --warm > $OUT/first-warm.log 2>&1; echo "warm rc $?"; grep "ms" $OUT/first-warm.log | grep -v Loading | tail -2
cd ..
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/plugins/eagle/test_eagle_bare_steps.py tests/core/test_policy.py > $OUT/tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.log
cd benchmarks
wait $BUILD; echo "build waited at $((SECONDS-t0)) s"
PS="python3 policy_steps.py --device cuda"
run() { name=$1; shift; timeout $1 $PS "${@:2}" > $OUT/$name.log 2>&1; echo "$name rc $?"; grep -v "Loading\|Warning\|warn\|Capturing" $OUT/$name.log | tail -16 | cut -c1-900; }
run ngram-bench-b32-T08 80 --model /tmp/bm/bench --method ngram:4 --batch 32 --prompts 64 --max-tokens 64 --temperature 0.8 --repeats 2
run eagle3-b8-T0 70 --model /tmp/rb/target --draft-model /tmp/rb/eagle3 --method eagle3:3 --batch 8 --prompts 16 --max-tokens 96 --temperature 0 --repeats 3
run eagle3-b8-T08 70 --model /tmp/rb/target --draft-model /tmp/rb/eagle3 --method eagle3:3 --batch 8 --prompts 16 --max-tokens 96 --temperature 0.8 --repeats 3
