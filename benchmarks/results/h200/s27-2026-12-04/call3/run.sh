# measure only: is the recompute's cost a first call in a process, or every new shape? and the engine's warm-up
set -x
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb','eagle3'))" > $OUT/rb.log 2>&1; echo "rb rc $?"
timeout 60 python3 recompute_first.py --random-bench /tmp/rb > $OUT/first-cold.log 2>&1; echo "cold rc $?"; grep "ms" $OUT/first-cold.log | grep -v Loading | tail -2
timeout 60 python3 recompute_first.py --random-bench /tmp/rb --warm > $OUT/first-warm.log 2>&1; echo "warm rc $?"; grep "ms" $OUT/first-warm.log | grep -v Loading | tail -2
PS="python3 policy_steps.py --device cuda --model /tmp/rb/target"
run() { name=$1; shift; timeout $1 $PS "${@:2}" > $OUT/$name.log 2>&1; echo "$name rc $?"; grep -v "Loading\|Warning\|warn\|Capturing" $OUT/$name.log | tail -16 | cut -c1-900; }
run eagle3-b8-T0 90 --draft-model /tmp/rb/eagle3 --method eagle3:3 --batch 8 --prompts 16 --max-tokens 96 --temperature 0 --repeats 3
run eagle3-b8-T08 90 --draft-model /tmp/rb/eagle3 --method eagle3:3 --batch 8 --prompts 16 --max-tokens 96 --temperature 0.8 --repeats 3
cd ..
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/plugins/eagle/test_eagle_bare_steps.py tests/core/test_policy.py > $OUT/tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.log
