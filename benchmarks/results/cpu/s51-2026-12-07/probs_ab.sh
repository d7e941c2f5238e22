# s51: seeded T = 0.8 drafting of the head methods before (1854586, s50: seeded batches send and validate draft probs no
# request reads) and after (this library: probs=False, no validation), one run after the other on the 2-core CPU
# (bundled tiny pair, batch 8, fixed k): s49's A/B script with s50's tip as the old tree. From the repo root, venv
# active; results in /tmp/ab/{old,new}.{md,json}.
OLD=${OLD:-1854586} bash benchmarks/results/cpu/s49-2026-12-07/draftkeys_ab.sh
