# s53 call 4 (fresh machine): call 1's traced row had auto's plain steps stall (5.3 steps over 4x the median a pass,
# 49 ms a pass, in runs of 3 fading over ~40 steps, at the same places of each pass) where the baseline's had none:
# the same row again without --trace (and without the timed-bare engine), then with it, to tell the trace's cost
# from the engine's.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
mkdir -p $OUT/c4 && cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb', 'medusa')" > /dev/null 2>&1
for v in plain traced; do
  X=""; [ $v = traced ] && X="--trace $OUT/c4/trace.jsonl"
  timeout 100 python3 policy_steps.py --device cuda --model /tmp/rb/target --draft-model /tmp/rb/medusa \
    --method medusa:2 --batch 32 --temperature 0.8 --workload completion --prompts 64 --calls 99 --max-tokens 128 \
    --repeats 3 $X > $OUT/c4/t08-$v.txt 2>&1
  echo "== $v rc $?"; grep -A6 "^| engine" $OUT/c4/t08-$v.txt | cut -d'|' -f2-9; grep -A4 "^steps over" $OUT/c4/t08-$v.txt
  grep "longest decode\|by reason" $OUT/c4/t08-$v.txt | cut -c1-300
done
gzip -f $OUT/c4/*.jsonl
