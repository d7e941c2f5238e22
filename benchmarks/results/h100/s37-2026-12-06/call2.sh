# s37 call 2: the bench pair's build (trained target + eagle3 head into /tmp/bm), then, with the time left, issue
# 28's methods over the fused baseline and over HF's layers in our graphs (s33's methods-fused.sh, both sides in one
# tarball: s34 lost the HF side to the device tool's file-count limit). Outputs under $OUT.
export PYTHONPATH=$PWD/.device-pkgs
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
bash benchmarks/results/h200/s27-2026-12-04/call1/bg.sh > $OUT/background.log 2>&1
tail -4 $OUT/background.log
left=$((${BUDGET:-585} - (SECONDS - t0)))
echo "pair built at $((SECONDS - t0)) s, $left s left"
if [ $left -gt 150 ]; then
  mkdir -p /tmp/mf && OUT=/tmp/mf LIMIT=$(( (left - 20) / 2 )) bash benchmarks/results/h200/s33-2026-12-05/methods-fused.sh
  tar czf $OUT/methods.tgz -C /tmp mf
fi
cd $OUT && tar czf build-logs.tgz *.log 2>/dev/null; ls
