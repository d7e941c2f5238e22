# s54 call 1 (fresh machine, carry .device-pkgs; ~320 s): ../../cpu/s54-2026-12-07/policy_parts.py on the GPU (the
# policy's host time in the engine against its hot loop's), then s53's two GPU leads with step_probe.py (per-step
# wall against the host thread's CPU time, and the CUDA allocator's counters), then s53's draft_host.py.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import torch, sys; print(torch.__version__, sys.version)"
P=benchmarks/results/h100/s54-2026-12-07/step_probe.py
mkdir -p $OUT/c1
timeout 80 python3 benchmarks/results/cpu/s54-2026-12-07/policy_parts.py --device cuda --batch 8 32 \
  > $OUT/c1/policy-parts.txt 2>&1; echo "== policy_parts rc $? at $((SECONDS - t0)) s"; grep -v Loading $OUT/c1/policy-parts.txt
timeout 90 python3 $P --device cuda --method ngram:4 --batch 32 --prompts 64 --calls 2 --temperature 0 \
  --max-tokens 128 --repeats 3 > $OUT/c1/ngram-b32.txt 2>&1
echo "== ngram rc $? at $((SECONDS - t0)) s"; grep -v Loading $OUT/c1/ngram-b32.txt | head -60
(cd benchmarks && python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb', 'medusa')" > /dev/null 2>&1)
echo "== pair at $((SECONDS - t0)) s"
timeout 120 python3 $P --device cuda --model /tmp/rb/target --draft-model /tmp/rb/medusa --method medusa:2 \
  --batch 32 --prompts 64 --calls 2 --temperature 0.8 --max-tokens 128 --repeats 3 > $OUT/c1/medusa-b32-t08.txt 2>&1
echo "== medusa rc $? at $((SECONDS - t0)) s"; grep -v Loading $OUT/c1/medusa-b32-t08.txt | head -70
for b in 32; do
  timeout 50 python3 benchmarks/results/cpu/s53-2026-12-07/draft_host.py --device cuda --batch $b --prompts $((2 * b)) \
    --always > $OUT/c1/draft-host-b$b.txt 2>&1; echo "== draft_host b$b rc $? at $((SECONDS - t0)) s"
  grep -v Loading $OUT/c1/draft-host-b$b.txt | head -30
done
