# For the next device session (written in s53, not yet run; ~250 s on a fresh machine): the two leads of s53.
# 1. call4.sh's question: auto's plain steps stalled in the traced medusa row; the row without --trace, then with it.
# 2. auto's drafting steps against fixed k's on the GPU: ngram:4, tiny model, batch 32, T = 0, both engines' steps by
#    rows side by side (policy_steps.py), then one pass each with host timers, auto's rule forced to draft
#    (../../cpu/s53-2026-12-07/draft_host.py --always): which host function, if any, takes the ~0.2 ms that the
#    policy's own time does not explain.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
mkdir -p $OUT/n
timeout 100 python3 benchmarks/results/cpu/s53-2026-12-07/draft_host.py --device cuda --batch 32 --prompts 64 --always \
  > $OUT/n/draft-host-b32.txt 2>&1; echo "== draft_host rc $? at $((SECONDS - t0)) s"; grep -v Loading $OUT/n/draft-host-b32.txt | head -45
(cd benchmarks && timeout 90 python3 policy_steps.py --device cuda --method ngram:4 --workload completion --temperature 0 \
  --batch 32 --prompts 128 --calls 4 --max-tokens 128 --repeats 5 > $OUT/n/ngram-b32.txt 2>&1
  echo "== ngram rows rc $? at $((SECONDS - t0)) s"; grep -A8 "ms a decode step by rows" $OUT/n/ngram-b32.txt)
OUT=$OUT bash benchmarks/results/h100/s53-2026-12-07/call4.sh
echo "end at $((SECONDS - t0)) s"
