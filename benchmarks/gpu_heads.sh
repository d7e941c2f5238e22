#!/usr/bin/env bash
# The hidden-state methods on the H200, in device calls that follow each other while the machine is warm
# (30 s between calls), from the repository root; results under $OUT, models under /tmp/bm (kept between calls).
#   STAGE=build        the bench pair alone (zoo presets bench, bench-draft), ~7 min until the nineteenth session
#                      (161 s of it encoding the corpus on one core; now on all 16: not timed yet)
#   STAGE=suite-heads  the whole CUDA suite (4 shards) with STAGE=heads beside it
#   STAGE=heads        heads for `bench` trained on the device: eagle3, medusa, dflash (each time-boxed), then the
#                      eagle profile on the trained pair (propose time, captured-chain use, kernels per KV bucket)
#   STAGE=e2e          e2e greedy bf16, each method at fixed k and under the auto policy: batch 1 (eagle3 k=5,
#                      medusa k=3 (and its static tree), dflash k=7, draft_model k=3, ngram; B1=0 skips) and batch 32 (completion:
#                      eagle3 k=3, medusa k=2, dflash k=3, draft_model k=3, ngram; B32=0 skips)
#   STAGE=policy       issue 24's batch-8 grid (T = 0 and 0.8, three workloads, fixed against auto), ~7 min;
#                      POLICY_METHODS: other methods (the heads' methods need STAGE=heads first)
#   STAGE=grid         issue 24's H200 grid at one batch size (GRID_BATCH: 1, 8 or 32): T = 0 and 0.8, the three
#                      workloads, each method fixed against auto (GRID_METHODS: default the heads' methods, which
#                      need STAGE=heads first; GRID_METHODS="ngram suffix draft_model" for the others)
#   STAGE=trees-prep   issue 25: tree CUDA tests beside the bench build, then eagle3 + medusa heads side by side
#   STAGE=trees        issue 25: trees against chains (eagle3 dynamic trees, medusa's static tree), batch 1 and 32
#   STAGE=build-plain  issue 28: the bench pair, then ngram / suffix / draft_model at batch 1 in the same call
#   STAGE=random       propose time of eagle3 / medusa / dflash (captured and eager) on random-init bench shapes
# Eleventh session: build alone, then suite-heads, then e2e (the tenth ran the build beside the suite and lost
# bench-draft to its time box).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
R=${OUT:-benchmarks/results/gpu-heads}; mkdir -p "$R"
BM=${BM:-/tmp/bm}
install() {
  [ "${NO_INSTALL:-0}" = 1 ] && return
  python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) > "$R/install.log" 2>&1
  python3 -m pip install -q --no-deps --no-build-isolation tests/fixtures/specdec-plugin-* >> "$R/install.log" 2>&1
}
case "${STAGE:-build}" in
build)
  # the bench pair alone (beside the suite it ran past 470 s in the tenth session): bench ~5 min, bench-draft ~2.5
  install
  timeout "${BUILD_LIMIT:-560}" python3 -m specdec.zoo --preset bench bench-draft --out "$BM" --device cuda \
      > "$R/build.log" 2>&1
  echo "build rc $? after $SECONDS s"; tr '\r' '\n' < "$R/build.log" | grep -v "Loading\|Writing\|^ *$" | tail -6 ;;
suite-heads)
  # the whole CUDA suite (4 shards) with the heads' training (STAGE=heads) beside it
  OUT="$R/gc" BACKGROUND="STAGE=heads NO_INSTALL=1 OUT=$R BM=$BM bash benchmarks/gpu_heads.sh" SHARDS=4 SUITE_LIMIT=330 \
      BG_TAIL=12 bash benchmarks/gpu_check.sh 2>&1 | tee "$R/suite-heads-console.log" ;;
heads)
  install
  [ -f "$BM/bench/config.json" ] || { echo "no $BM/bench: run STAGE=build first"; exit 3; }
  common=(--target "$BM/bench" --device cuda --batch-size 16 --seq-len 1024)
  timeout 260 python3 -m specdec_eagle.train_bundled "${common[@]}" --site-packages --out "$BM/bench-eagle3" \
      --megabytes 24 --steps 1000 --lr 2e-3 --draft-vocab-size 8192 > "$R/eagle3-train.log" 2>&1
  echo "eagle3 rc $?"; tr "\r" "\n" < "$R/eagle3-train.log" | grep -v "^train\|Loading" | tail -2
  timeout 200 python3 -m specdec_medusa.train_bundled "${common[@]}" --out "$BM/bench-medusa" --megabytes 16 \
      --steps 600 --num-heads 4 --draft-vocab-size 0 --no-fp16 > "$R/medusa-train.log" 2>&1
  echo "medusa rc $?"; tr "\r" "\n" < "$R/medusa-train.log" | grep -v "^train\|Loading" | tail -2
  timeout 300 python3 -m specdec_dflash.train_bundled "${common[@]}" --out "$BM/bench-dflash" --megabytes 24 \
      --steps "${DFLASH_STEPS:-2000}" --target-layer-ids "" --option anchors=128 --no-fp16 > "$R/dflash-train.log" 2>&1
  echo "dflash rc $?"; tr "\r" "\n" < "$R/dflash-train.log" | grep -v "^train\|Loading" | tail -2
  timeout 60 python3 benchmarks/gpu_eagle_profile.py --model "$BM/bench" --head "$BM/bench-eagle3" -k 5 --top 30 \
      --chain-buckets > "$R/eagle-profile.log" 2>&1
  grep -E "propose calls|tok/s\)|a replay" "$R/eagle-profile.log" ;;
e2e)
  install
  E2E=(python3 benchmarks/e2e.py --device cuda --model "$BM/bench" --draft-model "$BM/bench-draft" --no-peers
       --no-plots --no-progress --temperature 0 --method-option "eagle3.model=$BM/bench-eagle3"
       --method-option "medusa.model=$BM/bench-medusa" --method-option "dflash.model=$BM/bench-dflash" --out "$R")
  # issues 21-23 (fixed k) and 24 (fixed vs auto) side by side
  if [ "${B1:-1}" = 1 ]; then
    timeout "${B1_LIMIT:-330}" "${E2E[@]}" --batch 1 --prompts 4 --max-tokens 128 --repeats 2 --name b1 \
        --methods eagle3:5@fixed eagle3:5@auto medusa:3@fixed medusa:3@auto medusa:3@fixed+tree_choices=default \
        dflash:7@fixed dflash:7@auto draft_model:3@fixed draft_model:3@auto ngram@fixed ngram@auto > "$R/b1.log" 2>&1
    echo "b1 rc $? after $SECONDS s"; grep -E "^\| (completion|edit|repeated) " "$R/b1.md" | cut -c1-110
  fi
  if [ "${B32:-1}" = 1 ]; then
    timeout "${B32_LIMIT:-240}" "${E2E[@]}" --batch 32 --workloads completion --prompts 64 --max-tokens 128 \
        --repeats 2 --name b32 --methods eagle3:3@fixed eagle3:3@auto medusa:2@fixed medusa:2@auto dflash:3@fixed \
        dflash:3@auto draft_model:3@fixed ngram@fixed > "$R/b32.log" 2>&1
    echo "b32 rc $? after $SECONDS s"; grep -E "^\| completion " "$R/b32.md" | cut -c1-110
  fi ;;
policy)
  # issue 24's grid on the trained pair: batch 8, T = 0 and 0.8, the three workloads, each method fixed and auto
  install
  timeout "${POLICY_LIMIT:-420}" python3 benchmarks/e2e.py --device cuda --model "$BM/bench" \
      --draft-model "$BM/bench-draft" --no-peers --no-plots --no-progress --temperature 0 0.8 \
      --method-option "eagle3.model=$BM/bench-eagle3" --method-option "medusa.model=$BM/bench-medusa" \
      --method-option "dflash.model=$BM/bench-dflash" --out "$R" --batch 8 --prompts 16 --max-tokens 96 \
      --repeats 1 --name b8-policy --methods ${POLICY_METHODS:-eagle3:3@fixed eagle3:3@auto medusa:2@fixed \
      medusa:2@auto dflash:3@fixed dflash:3@auto draft_model:3@fixed draft_model:3@auto ngram@fixed ngram@auto} \
      > "$R/b8-policy.log" 2>&1
  echo "b8-policy rc $? after $SECONDS s"; grep -E "^\| (completion|edit|repeated) " "$R/b8-policy.md" | cut -c1-110 ;;
grid)
  # issue 24's grid (completion / edit / repeated x T = 0, 0.8 x each method fixed and auto) at batch GRID_BATCH;
  # k per method as the earlier H200 rows (eagle3 3, medusa 2, dflash 3, draft_model 3, ngram / suffix 4)
  install
  export PYTHONPATH="$PWD/.device-pkgs${PYTHONPATH:+:$PYTHONPATH}"  # suffix needs arctic-inference
  gb=${GRID_BATCH:-8}
  declare -A K=([eagle3]=3 [medusa]=2 [dflash]=3 [draft_model]=3 [ngram]=4 [suffix]=4)
  methods=()
  for m in ${GRID_METHODS:-eagle3 medusa dflash}; do methods+=("$m:${K[$m]}@fixed" "$m:${K[$m]}@auto"); done
  case "$gb" in 1) shape=(--prompts 8 --max-tokens 64) ;; 8) shape=(--prompts 16 --max-tokens 96) ;;
                *) shape=(--prompts 64 --max-tokens 64) ;; esac
  timeout "${GRID_LIMIT:-560}" python3 benchmarks/e2e.py --device cuda --model "$BM/bench" \
      --draft-model "$BM/bench-draft" --no-peers --no-plots --no-progress --temperature 0 0.8 \
      --method-option "eagle3.model=$BM/bench-eagle3" --method-option "medusa.model=$BM/bench-medusa" \
      --method-option "dflash.model=$BM/bench-dflash" --out "$R" --batch "$gb" "${shape[@]}" --repeats 2 \
      --name "grid-b$gb-${GRID_NAME:-heads}" --methods "${methods[@]}" > "$R/grid-b$gb.log" 2>&1
  echo "grid b$gb rc $? after $SECONDS s"
  grep -E "^\| (completion|edit|repeated) " "$R/grid-b$gb-${GRID_NAME:-heads}.md" | cut -c1-130 ;;
trees-prep)
  # issue 25 in one call: the tree code's CUDA tests in the background, the bench target alone (no bench-draft),
  # then the eagle3 and medusa heads trained side by side (each time-boxed); STAGE=trees next
  install
  (OUT="$R/t" NO_INSTALL=1 LIMIT="${TEST_LIMIT:-240}" TEST_GROUPS="tests/core/test_tree_forward.py tests/core/test_tree_engine.py tests/core/test_cuda_graphs.py;tests/plugins/eagle/test_eagle_graph_tree.py tests/plugins/eagle/test_eagle_tree.py tests/plugins/eagle/test_eagle_graph_chain.py;tests/plugins/medusa/test_medusa_tree.py tests/core/test_policy.py tests/plugins/medusa/test_medusa.py" \
      bash benchmarks/gpu_targeted.sh > "$R/targeted-console.log" 2>&1 &)
  timeout "${BUILD_LIMIT:-330}" python3 -m specdec.zoo --preset bench --out "$BM" --device cuda > "$R/build.log" 2>&1
  echo "build rc $? after $SECONDS s"; tr '\r' '\n' < "$R/build.log" | grep -v "Loading\|Writing\|^ *$" | tail -3
  common=(--target "$BM/bench" --device cuda --batch-size 16 --seq-len 1024)
  timeout "${HEADS_LIMIT:-200}" python3 -m specdec_eagle.train_bundled "${common[@]}" --site-packages \
      --out "$BM/bench-eagle3" --megabytes 24 --steps 1000 --lr 2e-3 --draft-vocab-size 8192 > "$R/eagle3-train.log" 2>&1 &
  timeout "${HEADS_LIMIT:-200}" python3 -m specdec_medusa.train_bundled "${common[@]}" --out "$BM/bench-medusa" \
      --megabytes 16 --steps 600 --num-heads 4 --draft-vocab-size 0 --no-fp16 > "$R/medusa-train.log" 2>&1 &
  wait
  for h in eagle3 medusa; do echo "$h: $(tr '\r' '\n' < "$R/$h-train.log" | grep -v "^train\|Loading" | tail -1)"; done
  ls "$BM"; cat "$R/targeted-console.log" ;;
trees)
  # issue 25 on the trained pair: token trees against chains, same run. Batch 1 (three workloads): eagle3's
  # dynamic trees (top-k x node budget) and medusa's static tree beside their chains; batch 32 (completion):
  # fixed trees and trees under the auto policy (which falls back to chains, or to plain steps, where they lose)
  install
  # suffix's trees need arctic-inference (carry .device-pkgs: build_suffix_backend.sh)
  export PYTHONPATH="$PWD/.device-pkgs${PYTHONPATH:+:$PYTHONPATH}"
  E2E=(python3 benchmarks/e2e.py --device cuda --model "$BM/bench" --no-peers --no-plots --no-progress
       --temperature 0 --method-option "eagle3.model=$BM/bench-eagle3" --method-option "medusa.model=$BM/bench-medusa"
       --out "$R")
  suffix=()
  python3 -c "import arctic_inference.suffix_decoding" 2>/dev/null && suffix=(suffix@fixed suffix@fixed+use_tree_spec=true)
  if [ "${B1:-1}" = 1 ]; then
    timeout "${B1_LIMIT:-330}" "${E2E[@]}" --batch 1 --prompts 4 --max-tokens 128 --repeats 2 --name b1-trees \
        --methods eagle3:5@fixed eagle3:8@fixed eagle3:5@fixed+tree_top_k=4+tree_total_tokens=16 \
        eagle3:6@fixed+tree_top_k=8+tree_total_tokens=32 eagle3:8@fixed+tree_top_k=8+tree_total_tokens=48 \
        medusa:3@fixed medusa:3@fixed+tree_choices=default medusa:3@auto+tree_choices=default "${suffix[@]}" \
        > "$R/b1-trees.log" 2>&1
    echo "b1-trees rc $? after $SECONDS s"; grep -E "^\| (completion|edit|repeated) " "$R/b1-trees.md" | cut -c1-130
  fi
  if [ "${B32:-1}" = 1 ]; then
    timeout "${B32_LIMIT:-240}" "${E2E[@]}" --batch 32 --workloads completion --prompts 64 --max-tokens 128 \
        --repeats 2 --name b32-trees --methods eagle3:3@fixed eagle3:3@fixed+tree_top_k=4+tree_total_tokens=16 \
        eagle3:3@auto+tree_top_k=4+tree_total_tokens=16 medusa:2@fixed medusa:2@fixed+tree_choices=default \
        medusa:2@auto+tree_choices=default > "$R/b32-trees.log" 2>&1
    echo "b32-trees rc $? after $SECONDS s"; grep -E "^\| completion " "$R/b32-trees.md" | cut -c1-130
  fi ;;
build-plain)
  # issue 28 in one call (a later call may land on a fresh machine and lose /tmp/bm): the bench pair, then
  # ngram, suffix (when .device-pkgs is carried: build_suffix_backend.sh) and draft_model at batch 1 over the
  # fused baseline, in what is left of the call (PLAIN_LIMIT, default 585 s in all)
  install
  export PYTHONPATH="$PWD/.device-pkgs${PYTHONPATH:+:$PYTHONPATH}"
  timeout "${BUILD_LIMIT:-480}" python3 -m specdec.zoo --preset bench bench-draft --out "$BM" --device cuda \
      > "$R/build.log" 2>&1
  echo "build rc $? after $SECONDS s"
  left=$(( ${PLAIN_LIMIT:-585} - SECONDS ))
  methods=(ngram@fixed draft_model:3@fixed)
  python3 -c "import arctic_inference.suffix_decoding" 2>/dev/null && methods+=(suffix@fixed)
  [ "$left" -gt 30 ] && timeout "$left" python3 benchmarks/e2e.py --device cuda --model "$BM/bench" \
      --draft-model "$BM/bench-draft" --no-peers --no-plots --no-progress --temperature 0 --out "$R" --batch 1 \
      --prompts 4 --max-tokens 128 --repeats 2 --name b1-plain --methods "${methods[@]}" > "$R/b1-plain.log" 2>&1
  echo "b1-plain rc $? after $SECONDS s"; grep -E "^\| (completion|edit|repeated) " "$R/b1-plain.md" | cut -c1-110 ;;
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
