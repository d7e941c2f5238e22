# s42 call 1: the trained bench pair's build into /tmp/bm (s37's call 2, no methods after it), then eagle3@auto at
# batch 1, T = 0, step by step on it (s41's grid: 0.99x on completion where fixed k ran 1.29x, its drafting steps
# read 1.99 ms against 0.94-0.97 later), completion then edit for contrast.
BUDGET=0 bash benchmarks/results/h100/s37-2026-12-06/call2.sh
export PYTHONPATH=$PWD/.device-pkgs
cd benchmarks
for w in completion edit; do
  timeout ${STEPS_LIMIT:-110} python3 policy_steps.py --device cuda --model /tmp/bm/bench --draft-model /tmp/bm/bench-eagle3 \
    --method eagle3:3 --batch 1 --temperature 0 --workload $w --prompts 8 --max-tokens 128 --repeats 8 \
    > $OUT/steps-eagle3-b1-$w.txt 2>&1
  echo "steps $w rc $?"; grep -E "baseline .* fixed|^decode|^\| (baseline|fixed|auto) " $OUT/steps-eagle3-b1-$w.txt
done
