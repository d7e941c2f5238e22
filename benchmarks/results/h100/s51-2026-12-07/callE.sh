# s51 call E (fresh machine, ~150 s): call D's row traced. Random bench-shaped pair, medusa:2, batch 32, T = 0.8
# (seeded), completion, the whole workload a pass: auto ran 0.87x of the baseline (fixed k 0.94x) while its cost
# table had drafting 1.38x faster, its plain steps at 0.94 ms against the baseline's 0.65. Every timed step of the
# auto engine written (--trace) to see which plain steps set that estimate.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb', 'medusa'))" > $OUT/rb.log 2>&1
timeout 120 python3 policy_steps.py --device cuda --model /tmp/rb/target --draft-model /tmp/rb/medusa --method medusa:2 \
  --batch 32 --temperature 0.8 --workload completion --prompts 64 --calls 99 --max-tokens 128 --repeats 3 \
  --trace $OUT/trace-medusa-b32-t08.jsonl > $OUT/steps.txt 2>&1
echo "rc $?"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto) |by reason" $OUT/steps.txt | cut -c1-300
