#!/usr/bin/env bash
# Call B (right after A, the machine still warm): an EAGLE-3 head for the bench target, trained on the device,
# then e2e batch 1 (eagle3 k=5 against draft_model k=3) and batch 32 (completion). Needs /tmp/bm from call A;
# without it, rebuilds the pair and stops (call C measures).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
R=$OUT; mkdir -p $R/b
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) > $R/b/install.log 2>&1
if [ ! -f /tmp/bm/bench-draft/config.json ]; then
  echo "no bench pair on this machine: rebuilding it"
  timeout 480 python3 -m specdec.zoo --preset bench bench-draft --out /tmp/bm --device cuda > $R/b/zoo.log 2>&1
  tail -5 $R/b/zoo.log; exit 3
fi
H=/tmp/bm/bench-eagle3
if [ ! -f $H/config.json ]; then
  timeout ${TRAIN_LIMIT:-260} python3 -m specdec_eagle.train_bundled --target /tmp/bm/bench --site-packages \
      --device cuda --out $H --megabytes ${MB:-24} --steps ${STEPS:-1000} --batch-size 16 --seq-len 1024 \
      --lr 2e-3 --draft-vocab-size 8192 > $R/b/train.log 2>&1
  echo "train rc $? after $SECONDS s"; tr '\r' '\n' < $R/b/train.log | grep -v "^ *$" | grep -v "it/s\]$" | tail -6
fi
cp $H/README.md $R/b/eagle3-card.md 2>/dev/null; cp $H/metrics.json $R/b/eagle3-metrics.json 2>/dev/null
G=false
if ls /tmp/gc/cuda-suite/shard-*.log >/dev/null 2>&1 && grep -q "test_eagle_graph_chain" /tmp/gc/cuda-suite/shard-*.log \
   && ! grep -h "^FAILED\|^ERROR" /tmp/gc/cuda-suite/shard-*.log | grep -q eagle_graph_chain; then G=true; fi
grep -l "test_eagle_graph_chain" /tmp/gc/cuda-suite/shard-*.log >/dev/null 2>&1 || G=${GRAPHS:-false}
echo "draft_cuda_graphs=$G"
E2E="python3 benchmarks/e2e.py --device cuda --model /tmp/bm/bench --draft-model /tmp/bm/bench-draft --no-peers --no-plots --no-progress --temperature 0 --method-option eagle3.model=$H --method-option eagle3.draft_cuda_graphs=$G"
timeout 200 $E2E --batch 1 --prompts 4 --max-tokens 128 --repeats 2 --methods eagle3:5 draft_model:3 \
    --out $R/b --name b1-k5 > $R/b/b1-k5.log 2>&1
echo "b1 rc $? at $SECONDS s"; grep -E "^\| (completion|edit|repeated) " $R/b/b1-k5.md | cut -c1-150
timeout 200 $E2E --batch 32 --workloads completion --prompts 64 --max-tokens 128 --repeats 2 \
    --methods eagle3:3 draft_model:3 ngram --out $R/b --name b32 > $R/b/b32.log 2>&1
echo "b32 rc $? at $SECONDS s"; grep -E "^\| (completion|edit|repeated) " $R/b/b32.md | cut -c1-150
tar czf $R/b.tgz -C $R b && rm -rf $R/b
