# s42: where a mostly-plain auto row's ~4-5% goes on the GPU (s40: 0.957x over 30 passes where the same engines
# forced plain ran 0.995x). Random bench-shaped pair (drafting never pays), batch 8, T = 0.8, e2e's whole workload a
# pass (--calls 99), every decode step timed in the baseline, fixed and auto engines, the auto engine's steps by mode
# and rows, the time outside the decode steps.
export PYTHONPATH=$PWD/.device-pkgs
python3 -c "import specdec" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb'))" > $OUT/rb.log 2>&1
cat $OUT/rb.log
for w in ${WORKLOADS:-completion repeated}; do
  for m in ${METHODS:-ngram:4 suffix:4 eagle3:3}; do
    d=""; [ "${m%%:*}" = eagle3 ] && d="--draft-model /tmp/rb/eagle3"
    timeout ${LIMIT:-90} python3 policy_steps.py --device cuda --model /tmp/rb/target $d --method $m --batch 8 \
      --temperature 0.8 --workload $w --prompts 64 --calls 99 --max-tokens 128 --repeats ${REPEATS:-6} $([ "${TRACE:-1}" = 1 ] && echo --trace $OUT/trace-${m%%:*}-$w.jsonl) \
      > $OUT/steps-${m%%:*}-$w.txt 2>&1
    echo "== $m $w rc $?"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto) |by reason|unpiped|^  (baseline|fixed|auto):" $OUT/steps-${m%%:*}-$w.txt
  done
done
cd $OUT && { ls trace-*.jsonl >/dev/null 2>&1 && tar czf traces.tgz trace-*.jsonl && rm trace-*.jsonl; true; }
