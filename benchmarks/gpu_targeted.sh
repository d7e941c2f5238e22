#!/usr/bin/env bash
# A short device call: the CUDA tests of the code a session changed after its whole-suite run, in three parallel
# pytest processes (results under $OUT/targeted/). Usage: LIMIT=110 [TEST_GROUPS=...] bash benchmarks/gpu_targeted.sh
set -u
OUT=${OUT:-benchmarks/results/gpu-targeted}
mkdir -p "$OUT/targeted"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) > "$OUT/install.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation tests/fixtures/specdec-plugin-* >> "$OUT/install.log" 2>&1
groups=("tests/core/test_cuda_graphs.py tests/core/test_metadata.py tests/core/test_policy.py tests/core/test_keyed.py"
        "tests/plugins/eagle/test_eagle_graph_chain.py tests/plugins/dflash/test_dflash_graph.py"
        "tests/plugins/draft_model/test_draft_model.py tests/core/test_engine.py::test_seeded_sampled_output_follows_target_and_ignores_drafts tests/core/test_engine.py::test_seeded_sampling_reproducible")
# TEST_GROUPS="a.py b.py;c.py" replaces the groups above (one pytest process per ';'-separated group)
[ -n "${TEST_GROUPS:-}" ] && IFS=';' read -r -a groups <<< "$TEST_GROUPS"
PIDS=()
for i in "${!groups[@]}"; do
  OMP_NUM_THREADS=4 timeout "${LIMIT:-110}" python3 -m pytest -q -p no:cacheprovider -rs ${groups[$i]} 2>&1 \
      | grep -v "^DEBUG" > "$OUT/targeted/group-$i.log" &
  PIDS+=($!)
done
wait "${PIDS[@]}"
for i in "${!groups[@]}"; do echo "group $i: $(tail -n 1 "$OUT/targeted/group-$i.log")"; done
grep -h "^FAILED\|^ERROR" "$OUT"/targeted/group-*.log | head -20
