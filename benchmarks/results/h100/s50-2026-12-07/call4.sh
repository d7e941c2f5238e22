# s50 call 4 (28 s, same warm machine right after call3.sh): call 1's ngram:4 batch-32 T = 0.8 policy_steps run
# again without --trace (whose per-step logging runs inside the auto engine's timed steps)
export PYTHONPATH=$PWD/.device-pkgs; mkdir -p $OUT/nt
timeout 150 python3 benchmarks/policy_steps.py --device cuda --model /tmp/bm/bench --method ngram:4 --batch 32 --prompts 64 \
  --calls 2 --temperature 0.8 --max-tokens 128 --repeats 3 > $OUT/nt/log 2>&1
