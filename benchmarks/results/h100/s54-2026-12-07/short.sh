# s54, the last device try (~200 s): call1.sh's first two parts only (policy_parts.py on the GPU, then step_probe.py
# on ngram:4, tiny model, batch 32, T = 0).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/s
timeout 70 python3 benchmarks/results/cpu/s54-2026-12-07/policy_parts.py --device cuda --batch 8 32 \
  > $OUT/s/policy-parts.txt 2>&1; echo "== policy_parts rc $? at $((SECONDS - t0)) s"; grep -v Loading $OUT/s/policy-parts.txt
timeout 80 python3 benchmarks/results/h100/s54-2026-12-07/step_probe.py --device cuda --method ngram:4 --batch 32 \
  --prompts 64 --calls 2 --temperature 0 --max-tokens 128 --repeats 3 > $OUT/s/ngram-b32.txt 2>&1
echo "== ngram rc $? at $((SECONDS - t0)) s"; grep -v Loading $OUT/s/ngram-b32.txt | head -50
