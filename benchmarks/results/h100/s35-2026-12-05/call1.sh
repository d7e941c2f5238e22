# s35 call 1: the seeded launch path's parts (keyed_launch.py) on a quiet device, then the bench pair's build
# (trained target + eagle3 head into /tmp/bm, for the grid of call 2), then s34's diagnostic (the policy's plain-run
# fast paths on the device). Outputs under $OUT.
export PYTHONPATH=$PWD/.device-pkgs
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 benchmarks/keyed_launch.py --batch 8 --vocab 4096 2>&1 | tee $OUT/keyed-launch.log
bash benchmarks/results/h200/s27-2026-12-04/call1/bg.sh > $OUT/background.log 2>&1
tail -4 $OUT/background.log
LIMIT=${DIAG_LIMIT:-75} bash benchmarks/results/h100/s34-2026-12-05/diag.sh
cd $OUT && tar czf call1.tgz *.log *.json 2>/dev/null; ls
