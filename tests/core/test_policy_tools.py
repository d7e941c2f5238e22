"""The policy's diagnostic tools in ``benchmarks/`` run on the CPU and print what they promise (they are used on the
device, where a broken one costs a call)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
SMALL = ["--device", "cpu", "--batch", "2", "--prompts", "2", "--max-tokens", "8", "--repeats", "1",
         "--method", "ngram:2", "--temperature", "0.8"]


def _run(tool: str, *extra: str) -> str:
    proc = subprocess.run([sys.executable, str(BENCH / tool), *SMALL, *extra], capture_output=True, text=True,
                          timeout=300, cwd=BENCH)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _profile_rows(out: str, policy: str) -> list[str]:
    """plain_profile.py's table rows below its header: a function from a file, a built-in ("~:0(...)"), or code made
    at run time (a dataclass's "<string>:N(__init__)"), whichever the top ones by difference are."""
    lines = out.splitlines()
    head = lines.index(f"| function | baseline us a step | {policy} us a step | difference |")
    return [line for line in lines[head + 2:] if line.startswith("| ")]


def test_plain_profile_lists_functions_by_the_extra_host_time_per_step():
    out = _run("plain_profile.py", "--top", "5")
    assert "ngram:2@auto (profiled): baseline" in out and "ms a step over" in out
    rows = _profile_rows(out, "auto")
    assert len(rows) == 5
    extra = [float(line.rsplit("|", 2)[-2]) for line in rows]
    assert extra == sorted(extra, reverse=True)  # by the auto engine's extra microseconds a step


def test_policy_steps_prints_each_engines_steps_and_the_cost_table():
    out = _run("policy_steps.py")
    assert "completion (1 call(s) a pass), batch 2, T = 0.8, ngram:2: baseline" in out
    assert "| auto |" in out and "auto's cost table:" in out and "spec_empty_steps" in out
    assert "  baseline: median " in out and "  auto: median " in out  # every engine's stalls
    table = out[out.index("ms a decode step by rows"):].splitlines()  # every engine's steps by rows, side by side
    assert table[2] == "| rows | baseline | fixed | auto |" and table[4].startswith("| 1-1 | ")
    assert table[5].startswith("| 2-2 | ") and table[5].count("(") == 3


def test_policy_steps_runs_every_call_traces_the_steps_and_times_another_policy(tmp_path):
    """``--calls``: e2e's calls of the workload a pass (repeated: calls in threes); ``--trace``: the auto engine's
    timed steps as JSON lines with the bucket's estimates; ``--policy-file``: an engine with another policy.py."""
    import json

    old = tmp_path / "old_policy.py"
    old.write_text((BENCH.parent / "core" / "specdec" / "policy.py").read_text())
    trace = tmp_path / "trace.jsonl"
    out = _run("policy_steps.py", "--workload", "repeated", "--calls", "99", "--trace", str(trace),
               "--policy-file", str(old))
    assert "repeated (3 call(s) a pass), batch 2, T = 0.8, ngram:2: baseline" in out
    assert f"| auto, {old} |" in out
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(steps) >= 3 * 8 // 2  # three calls of two requests, 8 tokens each, at least one token a step
    assert all(s["mode"] in (0, 1) and s["rows"] in (1, 2) and s["ms"] > 0 and s["why"] for s in steps)
    assert all("plain_ms" in s and "spec_ms" in s for s in steps)


def test_plain_profile_times_a_never_drafting_engine_against_the_baseline():
    out = _run("plain_profile.py", "--top", "3", "--policy", "plain", "--passes", "2")
    assert "2 timed passes each, alternating: baseline" in out and "plain / baseline" in out
    assert "ngram:2@plain (profiled): baseline" in out
    rows = _profile_rows(out, "plain")
    assert len(rows) == 3
    assert "plain's decode steps that drafted: 0 of " in out


def test_policy_host_times_this_policy_beside_an_older_one(tmp_path):
    old = tmp_path / "old_policy.py"
    old.write_text((BENCH.parent / "core" / "specdec" / "policy.py").read_text())
    proc = subprocess.run([sys.executable, str(BENCH / "policy_host.py"), "--batch", "1", "4", "--steps", "200",
                           "--repeats", "1", "--old", str(old)], capture_output=True, text=True, timeout=300, cwd=BENCH)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line[:4] in ("| 1 ", "| 4 ")]
    assert [r[0].strip() for r in rows] == ["1", "4"]
    assert all(float(x) > 0 for r in rows for x in r[1:]) and all(len(r) == 3 for r in rows)
