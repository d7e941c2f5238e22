# s49: issue 24's grid on the library as it stands (fixed and auto rows in one run on one machine; trained bench pair:
# target, eagle3 and medusa heads in /tmp/bm, built here by s46's pair.sh when the machine is fresh). Each batch runs
# as two e2e calls, T = 0 then T = 0.8, each given half the time left of TOTAL seconds, so that a cut loses one part.
#   BATCH=1 PROMPTS=8 REPEATS=3 TOTAL=580 bash benchmarks/results/h100/s49-2026-12-07/grid.sh   # fresh: builds first
#   BATCH=8 REPEATS=4 TOTAL=570 bash ...; BATCH=32 PROMPTS=64 REPEATS=4 TOTAL=570 bash ...      # warm, within 30 s
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -c "import specdec_medusa" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . \
  $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
if [ ! -d /tmp/bm/bench-medusa ] || [ ! -d /tmp/bm/bench-eagle3 ]; then
  mkdir -p /tmp/build && OUT=/tmp/build bash benchmarks/results/h100/s46-2026-12-06/pair.sh
  tar czf $OUT/build.tgz -C /tmp build
  echo "pair built at $((SECONDS - t0)) s"
fi
B=${BATCH:-8}
METHODS=${METHODS:-eagle3:3@auto eagle3:3@fixed medusa:2@auto medusa:2@fixed ngram:4@auto ngram:4@fixed suffix:4@auto suffix:4@fixed}
mkdir -p /tmp/grid
parts=(0 0.8)
for i in 0 1; do
  T=${parts[$i]}
  left=$(( ${TOTAL:-570} - (SECONDS - t0) - 15 ))
  limit=$(( left / (2 - i) ))
  echo "b$B T=$T: $limit s"
  (cd benchmarks && timeout $limit python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots \
    --no-progress --temperature $T --method-option eagle3.model=/tmp/bm/bench-eagle3 \
    --method-option medusa.model=/tmp/bm/bench-medusa --out /tmp/grid --name grid-b$B-t$T --batch $B \
    --prompts ${PROMPTS:-64} --max-tokens 128 --repeats ${REPEATS:-4} --methods $METHODS > /tmp/grid/grid-b$B-t$T.log 2>&1)
  echo "rc $? at $((SECONDS - t0)) s"
done
tar czf $OUT/grid-b$B.tgz -C /tmp grid
python3 benchmarks/auto_table.py /tmp/grid/grid-b$B-t*.json 2>&1 | tail -24
