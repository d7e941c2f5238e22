# s43 call 2: issue 28's Done-when table in one run: our baseline (fused forward, CUDA graphs) against HF's layers in
# our graphs, HF eager and HF static cache compiled, random-init bench / 1B / 3B Llama targets, batch 1 and 8.
export PYTHONPATH=$PWD/.device-pkgs
python3 -c "import specdec" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)"
timeout ${LIMIT:-540} python3 benchmarks/target_sweep.py --sizes ${SIZES:-bench 1b 3b} --batch ${BATCHES:-1 8} --hf \
  --out $OUT/sweep > $OUT/sweep.log 2>&1
echo "sweep rc $?"; grep -v "^Loading\|it/s\]" $OUT/sweep.log | tail -30
