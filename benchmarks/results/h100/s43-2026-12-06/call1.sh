# s43 call 1: s42's stale-loser rule against the policy before it (2ece5fc's: policy-s42.patch undone), in the same
# interleaved passes (policy_steps.py --policy-file), random bench-shaped pair (drafting never pays: auto should
# run the baseline's time), batch 8, T = 0.8, e2e's whole workload a pass, every engine's stalls.
export PYTHONPATH=$PWD/.device-pkgs
python3 -c "import specdec" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
OLD=/tmp/policy_2ece5fc.py
patch -s -R -o $OLD core/specdec/policy.py < benchmarks/results/h100/s43-2026-12-06/policy-s42.patch 2>/dev/null || cp .device-pkgs/policy_2ece5fc.py $OLD || exit 3
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb'))" > $OUT/rb.log 2>&1
for w in ${WORKLOADS:-completion repeated}; do
  for m in ${METHODS:-eagle3:3 ngram:4}; do
    d=""; [ "${m%%:*}" = eagle3 ] && d="--draft-model /tmp/rb/eagle3"
    timeout ${LIMIT:-120} python3 policy_steps.py --device cuda --model /tmp/rb/target $d --method $m --batch 8 \
      --temperature 0.8 --workload $w --prompts 64 --calls 99 --max-tokens 128 --repeats ${REPEATS:-5} \
      --policy-file $OLD > $OUT/steps-${m%%:*}-$w.txt 2>&1
    echo "== $m $w rc $?"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto|policy)|stall" $OUT/steps-${m%%:*}-$w.txt | head -20
  done
done
