# Planned for the next device call, not run in s48 (~150 s): what a bare run's recompute costs at batch 32 by width,
# width 1 being what medusa needs (it reads only each request's last hidden state, yet LLM._recompute_bare recomputes
# every bare position). s48's batch-32 medusa tree rows under auto lost ~6-11 ms a switch into drafting.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
timeout 300 python3 benchmarks/recompute_profile.py --random-bench /tmp/rb --batch 32 --widths 1 17 100 300 \
  --out $OUT/recompute > $OUT/recompute.log 2>&1
echo "rc $?"; grep "^batch" $OUT/recompute.log
