# measure only (no suite): where auto's time goes when plain wins (random bench-shaped target, random eagle3 head)
set -x
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb','eagle3'))" > $OUT/rb.log 2>&1; echo "rb rc $?"
PS="python3 policy_steps.py --device cuda --model /tmp/rb/target"
run() { name=$1; shift; timeout $1 $PS "${@:2}" > $OUT/$name.log 2>&1; echo "$name rc $?"; grep -v "Loading\|Warning\|warn" $OUT/$name.log | tail -18 | cut -c1-1600; }
run ngram-b32-T08 90 --method ngram:4 --batch 32 --prompts 64 --max-tokens 64 --temperature 0.8 --repeats 2
run ngram-b32-T0 80 --method ngram:4 --batch 32 --prompts 64 --max-tokens 64 --temperature 0 --repeats 2
run eagle3-b8-T0 90 --draft-model /tmp/rb/eagle3 --method eagle3:3 --batch 8 --prompts 16 --max-tokens 96 --temperature 0 --repeats 3
run eagle3-b8-rep-T0 80 --draft-model /tmp/rb/eagle3 --method eagle3:3 --batch 8 --prompts 16 --max-tokens 96 --temperature 0 --workload repeated --repeats 3
run suffix-b32-T0 80 --method suffix:4 --batch 32 --prompts 64 --max-tokens 64 --temperature 0 --repeats 2
