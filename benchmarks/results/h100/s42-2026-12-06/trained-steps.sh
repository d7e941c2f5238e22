# s42: the trained bench pair (built into /tmp/bm if absent: s37's call 2, ~305 s), then auto's steps one by one
# (policy_steps.py --trace) where s41's grid read the policy's estimates far off the engines' steps: eagle3 at
# batch 1, T = 0, completion (its drafting steps read 1.99 ms against 0.94-0.97 later) and at batch 8, T = 0.8, edit
# (plain steps read 1.36 ms against the baseline's ~0.57: drafting "won" 1598 steps at 0.86x).
export PYTHONPATH=$PWD/.device-pkgs
[ -f /tmp/bm/bench-eagle3/config.json ] || BUDGET=0 bash benchmarks/results/h100/s37-2026-12-06/call2.sh
python3 -c "import specdec" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
cd benchmarks
run() {  # name, then policy_steps.py's arguments
  n=$1; shift
  timeout ${LIMIT:-100} python3 policy_steps.py --device cuda --model /tmp/bm/bench --prompts 64 --calls 99 \
    --max-tokens 128 --trace $OUT/trace-$n.jsonl "$@" > $OUT/steps-$n.txt 2>&1
  echo "== $n rc $?"; grep -E "call\(s\) a pass|^\| (baseline|fixed|auto) |by reason|unpiped" $OUT/steps-$n.txt
}
run eagle3-b1-t0-completion --draft-model /tmp/bm/bench-eagle3 --method eagle3:3 --batch 1 --temperature 0 \
  --workload completion --prompts 8 --repeats 4
run eagle3-b8-t08-edit --draft-model /tmp/bm/bench-eagle3 --method eagle3:3 --batch 8 --temperature 0.8 \
  --workload edit --repeats 4
run suffix-b8-t0-repeated --method suffix:4 --batch 8 --temperature 0 --workload repeated --repeats 4
