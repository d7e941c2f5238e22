set -u
cd /work/main
ARGS="--device cpu --batch 1 --temperature 0 --workloads completion edit --methods ngram suffix draft_model --prompts 8 --max-tokens 96 --repeats 2 --threads 1 --no-progress --no-peers --no-plots"
OLDPP=/tmp/oldtree/core:/tmp/oldtree/plugins/ngram:/tmp/oldtree/plugins/suffix:/tmp/oldtree/plugins/draft_model
for round in 1 2; do
  PYTHONPATH=$OLDPP .venv/bin/python /tmp/oldtree/benchmarks/e2e.py $ARGS --out /tmp/ab --name old$round > /tmp/ab_old$round.log 2>&1
  .venv/bin/python benchmarks/e2e.py $ARGS --out /tmp/ab --name new$round > /tmp/ab_new$round.log 2>&1
done
echo done
