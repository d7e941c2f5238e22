# s42 call B (right after call A, same machine): issue 24's batch-8 grid on the trained pair, fixed and auto rows,
# with this session's policy (a stale loser may not take over).
REPEATS=${REPEATS:-3} LIMIT=${LIMIT:-420} bash benchmarks/results/h100/s41-2026-12-06/grid.sh
