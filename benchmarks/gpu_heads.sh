#!/usr/bin/env bash
# The hidden-state methods on the H200, in three device calls that follow each other while the machine is warm
# (30 s between calls), from the repository root; results under $OUT, models under /tmp/bm (kept between calls).
#   STAGE=build  the whole suite (4 shards) with the bench pair's build beside it (zoo presets bench, bench-draft)
#   STAGE=heads  heads for `bench` trained on the device: eagle3, medusa, dflash (each time-boxed), then the
#                eagle profile on the trained pair (propose time, captured-chain use, kernels per KV bucket)
#   STAGE=e2e    e2e greedy bf16: batch 1 (eagle3 k=5, medusa k=3, dflash k=7, draft_model k=3) and batch 32
#                (completion: eagle3 k=3, medusa k=2, dflash k=3, draft_model k=3, ngram)
#   STAGE=random propose time of eagle3 / medusa / dflash (captured and eager) on random-init bench shapes
# Written in the ninth session from its device calls (benchmarks/results/h200/issue21-2026-12-02/device-*.sh);
# the heads and e2e stages have not run as one script yet: read the first call's output before the next.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
R=${OUT:-benchmarks/results/gpu-heads}; mkdir -p "$R"
BM=${BM:-/tmp/bm}
install() {
  python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) > "$R/install.log" 2>&1
  python3 -m pip install -q --no-deps --no-build-isolation tests/fixtures/specdec-plugin-* >> "$R/install.log" 2>&1
}
case "${STAGE:-build}" in
build)
  OUT=/tmp/gc BACKGROUND="timeout 470 python3 -m specdec.zoo --preset bench bench-draft --out $BM --device cuda" \
    SHARDS=4 SUITE_LIMIT=300 BG_TAIL=6 bash benchmarks/gpu_check.sh 2>&1 | tee "$R/build-console.log"
  tar czf "$R/suite.tgz" -C /tmp gc ;;
heads)
  install
  [ -f "$BM/bench/config.json" ] || { echo "no $BM/bench: run STAGE=build first"; exit 3; }
  common=(--target "$BM/bench" --device cuda --batch-size 16 --seq-len 1024)
  timeout 200 python3 -m specdec_eagle.train_bundled "${common[@]}" --site-packages --out "$BM/bench-eagle3" \
      --megabytes 24 --steps 1000 --lr 2e-3 --draft-vocab-size 8192 > "$R/eagle3-train.log" 2>&1
  echo "eagle3 rc $?"; tail -1 "$R/eagle3-train.log"
  timeout 150 python3 -m specdec_medusa.train_bundled "${common[@]}" --out "$BM/bench-medusa" --megabytes 16 \
      --steps 600 --num-heads 4 --draft-vocab-size 0 --no-fp16 > "$R/medusa-train.log" 2>&1
  echo "medusa rc $?"; tail -1 "$R/medusa-train.log"
  timeout 200 python3 -m specdec_dflash.train_bundled "${common[@]}" --out "$BM/bench-dflash" --megabytes 16 \
      --steps 1000 --target-layer-ids "" --no-fp16 > "$R/dflash-train.log" 2>&1
  echo "dflash rc $?"; tail -1 "$R/dflash-train.log"
  timeout 60 python3 benchmarks/gpu_eagle_profile.py --model "$BM/bench" --head "$BM/bench-eagle3" -k 5 --top 30 \
      --chain-buckets > "$R/eagle-profile.log" 2>&1
  grep -E "propose calls|tok/s\)|a replay" "$R/eagle-profile.log" ;;
e2e)
  install
  E2E=(python3 benchmarks/e2e.py --device cuda --model "$BM/bench" --draft-model "$BM/bench-draft" --no-peers
       --no-plots --no-progress --temperature 0 --method-option "eagle3.model=$BM/bench-eagle3"
       --method-option "medusa.model=$BM/bench-medusa" --method-option "dflash.model=$BM/bench-dflash" --out "$R")
  timeout 260 "${E2E[@]}" --batch 1 --prompts 4 --max-tokens 128 --repeats 2 \
      --methods eagle3:5 medusa:3 dflash:7 draft_model:3 --name b1 > "$R/b1.log" 2>&1
  echo "b1 rc $?"; grep -E "^\| (completion|edit|repeated) " "$R/b1.md" | cut -c1-130
  timeout 260 "${E2E[@]}" --batch 32 --workloads completion --prompts 64 --max-tokens 128 --repeats 2 \
      --methods eagle3:3 medusa:2 dflash:3 draft_model:3 ngram --name b32 > "$R/b32.log" 2>&1
  echo "b32 rc $?"; grep -E "^\| completion " "$R/b32.md" | cut -c1-130 ;;
random)
  # propose cost on a random-init bench-shaped target with untrained heads (no model build: acceptance is ~0,
  # each step still drafts k), after a suite run (RUN_AFTER of gpu_check.sh) or alone
  RB=${RB:-/tmp/rb}
  for spec in "eagle3 5" "medusa 3" "dflash 7" "dflash 7 draft_cuda_graphs=false"; do
    set -- $spec
    name=$1${3:+-eager}
    timeout 100 python3 benchmarks/gpu_eagle_profile.py --random-bench "$RB" --method "$1" -k "$2" --top 25 \
        ${3:+--option "$3"} > "$R/profile-$name.log" 2>&1
    echo "$name rc $?"; grep -E "propose calls|tok/s\)" "$R/profile-$name.log"
  done ;;
esac
