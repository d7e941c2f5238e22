# s51: seeded T = 0.8 drafting of the head methods before (1854586, s50: seeded batches send and validate draft probs no
# request reads) and after (this library: probs=False, no validation), one run after the other on the 2-core CPU
# (bundled tiny pair, batch 8, fixed k). From the repo root, venv active.
OLD=${OLD:-1854586}
rm -rf /tmp/old && git worktree add -q /tmp/old $OLD
for tree in old new; do
  if [ $tree = old ]; then R=/tmp/old; else R=$PWD; fi
  PP=$R/core; for p in $R/plugins/*/; do PP=$PP:$p; done
  (cd $R/benchmarks && PYTHONPATH=$PP timeout 900 python e2e.py --device cpu --no-peers --no-plots --no-progress \
    --temperature 0.8 --out /tmp/ab --name $tree --batch 8 --prompts 8 --max-tokens 48 --repeats 3 \
    --workloads completion repeated --methods medusa:2@fixed eagle3:3@fixed dflash:3@fixed > /tmp/ab-$tree.log 2>&1
   echo "$tree rc $?")
done
git worktree remove --force /tmp/old
