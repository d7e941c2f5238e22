# s50, after the suite on the built pair: (1) medusa and eagle3 at T = 0.8, batch 8, seeded drafting by DraftKeys
# (s49: medusa's drafting step 2.59 ms, fixed k 0.22x), fixed and auto; (2) ngram:4 at batch 32, T = 0.8,
# completion, the auto engine's passes traced step by step (s49: 0.48x, 81% drafted as the winner).
t0=$SECONDS
mkdir -p /tmp/gc/t08 /tmp/gc/trace
(cd benchmarks && timeout 95 python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
  --temperature 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --method-option medusa.model=/tmp/bm/bench-medusa \
  --out /tmp/gc/t08 --name b8-t08 --batch 8 --prompts 64 --max-tokens 128 --repeats 2 --workloads completion repeated \
  --methods medusa:2@fixed medusa:2@auto eagle3:3@fixed eagle3:3@auto > /tmp/gc/t08/log 2>&1)
echo "t08 rc $? at $((SECONDS - t0)) s"; grep -E "^\|" /tmp/gc/t08/b8-t08.md | cut -c1-160 | head -20
timeout 65 python3 benchmarks/policy_steps.py --device cuda --model /tmp/bm/bench --method ngram:4 --batch 32 \
  --prompts 64 --calls 2 --temperature 0.8 --max-tokens 128 --repeats 2 --trace /tmp/gc/trace/ngram-b32.jsonl \
  > /tmp/gc/trace/log 2>&1
echo "trace rc $? at $((SECONDS - t0)) s"; tail -30 /tmp/gc/trace/log | cut -c1-160
