"""Plugin specdec-plugin-suffix: discovery, options, the request lifecycle on arctic-inference's
SuffixDecodingCache, drafts equal to the cache's own speculation, and the missing-backend error."""

from __future__ import annotations

import logging
import os
import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import specdec
from specdec import DraftBatch, SpeculativeConfig, create_proposer


def _arctic_importable() -> bool:
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        return False
    return True


needs_arctic = pytest.mark.skipif(
    not _arctic_importable(),
    reason="arctic-inference is not installed (it needs a source build): run `make install`, see "
    "plugins/suffix/specdec_suffix/proposer.py::install_instructions",
)


def test_discoverable_once_installed():
    info = specdec.available_methods()["suffix"]
    assert info.distribution == "specdec-plugin-suffix" and info.version == "0.1.0" and info.status == "ok"
    assert info.proposer_class.__name__ == "SuffixProposer"


def test_defaults_follow_vllm_and_k_defaults_to_tree_depth(caplog):
    with caplog.at_level(logging.INFO, logger="specdec.suffix"):
        config = SpeculativeConfig(method="suffix")
    assert config.num_speculative_tokens == 24
    assert "num_speculative_tokens not given, using suffix_decoding_max_tree_depth=24" in caplog.text
    assert config.to_dict() == {
        "method": "suffix", "num_speculative_tokens": 24, "model": None, "on_bad_drafts": "error",
        "speculation_policy": "auto",
        "suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1,
        "defer_global_updates": False, "use_tree_spec": False, "tree_nodes": 0,
    }
    assert SpeculativeConfig(method="suffix", suffix_decoding_max_tree_depth=7).num_speculative_tokens == 7
    assert SpeculativeConfig(method="suffix", num_speculative_tokens=3).num_speculative_tokens == 3


@pytest.mark.parametrize("key, value, message", [
    ("suffix_decoding_max_tree_depth", 0,
     "suffix_decoding_max_tree_depth=0 is invalid: it must be an int >= 1 (the deepest context matched and "
     "the longest draft), e.g. 24."),
    ("suffix_decoding_max_tree_depth", 2.5,
     "suffix_decoding_max_tree_depth=2.5 is invalid: it must be an int >= 1 (the deepest context matched and "
     "the longest draft), e.g. 24."),
    ("suffix_decoding_max_cached_requests", -1,
     "suffix_decoding_max_cached_requests=-1 is invalid: it must be an int >= 0 and < 2**31 (0 disables the "
     "global tree of earlier responses), e.g. 10000."),
    ("suffix_decoding_max_spec_factor", -0.5,
     "suffix_decoding_max_spec_factor=-0.5 is invalid: it must be a number >= 0 (drafts are at most this "
     "factor times the matched length), e.g. 1.0."),
    ("suffix_decoding_min_token_prob", 1.5,
     "suffix_decoding_min_token_prob=1.5 is invalid: it must be a number in [0, 1] (drafting stops below "
     "this estimated token probability), e.g. 0.1."),
    ("suffix_decoding_min_token_prob", True,
     "suffix_decoding_min_token_prob=True is invalid: it must be a number in [0, 1] (drafting stops below "
     "this estimated token probability), e.g. 0.1."),
    ("defer_global_updates", "yes",
     "defer_global_updates='yes' is invalid: it must be True (update the global tree while the target verifies; "
     "faster, drafts can differ from arctic-inference's) or False (the default: drafts equal arctic-inference's)."),
])
def test_options_validated(key, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SpeculativeConfig(method="suffix", **{key: value})


def test_boundary_options_accepted():
    config = SpeculativeConfig(method="suffix", suffix_decoding_max_tree_depth=1, suffix_decoding_max_cached_requests=0,
                               suffix_decoding_max_spec_factor=0, suffix_decoding_min_token_prob=1)
    assert config.num_speculative_tokens == 1


# --- drafting ----------------------------------------------------------------------------------------


def _batch(history: dict[str, list[int]], sampled: dict[str, list[int]], k: int, max_model_len: int) -> DraftBatch:
    ids = list(history)
    lengths = np.array([len(history[r]) for r in ids], dtype=np.int64)
    token_ids = np.zeros((len(ids), int(lengths.max())), dtype=np.int32)
    for i, r in enumerate(ids):
        token_ids[i, : lengths[i]] = history[r]
    return DraftBatch(req_ids=ids, token_ids=token_ids, num_tokens=lengths,
                      sampled_token_ids=[list(sampled[r]) for r in ids], num_speculative_tokens=k,
                      max_model_len=max_model_len)


@needs_arctic
@pytest.mark.parametrize("depth, cached, factor, prob, k", [(24, 10000, 1.0, 0.1, 6), (5, 2, 2.0, 0.0, 9),
                                                            (8, 0, 0.5, 0.3, 4)])
@pytest.mark.parametrize("path", ["native", "cache methods"])
@pytest.mark.parametrize("plain", ["none", "observed", "skipped"])
def test_drafts_equal_suffix_cache_speculation(depth, cached, factor, prob, k, path, plain):
    """A workload of repetitive requests that join and leave (60 steps, up to 5 at once): with the
    default options every step's drafts equal what a SuffixDecodingCache driven by hand with the
    same history returns (each request's tokens added, then its draft taken, as vLLM does), and
    lengths vary per request. The proposer is driven as the engine drives it (while_verifying after
    every propose). Both ways of calling the backend: its trees directly and the cache's methods.
    Fails with defer_global_updates=True (the default before issue 18). ``plain`` "observed": the proposer
    is asked to draft on every third step only and observes the others: observing must put the tokens in the
    trees as proposing does. "skipped": the others call nothing (the speculation policy's plain steps for a
    skippable proposer) and the reference gets each request's tokens since its last call right before its
    draft (arrived in a run, its own tree is the same), and a request leaving after a skipped step gets its
    unseen tokens in by observe before remove_request, as the engine hands them over."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    options = dict(suffix_decoding_max_tree_depth=depth, suffix_decoding_max_cached_requests=cached,
                   suffix_decoding_max_spec_factor=factor, suffix_decoding_min_token_prob=prob)
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=k, **options))
    assert proposer._native is not None  # the layout of the pinned arctic-inference
    if path == "cache methods":
        proposer._native = None
    ref = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=cached)
    rng, max_model_len = random.Random(depth), 120
    motifs = [[rng.randrange(2, 12) for _ in range(rng.randrange(3, 9))] for _ in range(4)]

    def tokens(n):  # repeated motifs with some noise: plenty of partial matches
        out = []
        while len(out) < n:
            out += rng.choice(motifs) if rng.random() < 0.8 else [rng.randrange(2, 40)]
        return out[:n]

    every = 1 if plain == "none" else 3
    history, sampled, unseen, next_id, mixed_steps, drafted = {}, {}, {}, 0, 0, 0
    for step in range(60):
        if len(history) < 5 and rng.random() < 0.5:  # a request joins: prompt only, no draft yet
            rid = f"r{next_id}"
            next_id += 1
            history[rid] = tokens(rng.randrange(1, 30))
            sampled[rid], unseen[rid] = [], []
            proposer.add_request(rid, np.asarray(history[rid], dtype=np.int32))
            ref.start_request(rid, history[rid])
        if not history:
            continue
        called = step % every == 0
        if called:
            drafts = proposer.propose(_batch(history, sampled, k, max_model_len))
        elif plain == "observed":
            assert proposer.observe(_batch(history, sampled, k, max_model_len)) is True
        proposer.while_verifying()
        expected = []
        for rid in history:
            n = len(history[rid])
            if not sampled[rid]:
                expected.append([])
                continue
            if not called and plain == "skipped":
                expected.append(None)
                continue
            ref.add_active_response(rid, unseen[rid])
            unseen[rid] = []
            limit = min(k, max_model_len - n)
            expected.append(ref.speculate(rid, history[rid][-depth:], max_spec_tokens=limit, max_spec_factor=factor,
                                          min_token_prob=prob).token_ids if limit > 0 else [])
        if called:
            assert drafts.to_lists() == expected, f"step {step}"
            assert drafts.token_ids.shape == (len(history), k)
            mixed_steps += len({n for n in drafts.num_draft_tokens if n > 0}) > 1
            drafted += sum(drafts.num_draft_tokens)
        for rid, d in zip(list(history), expected):  # accept a random prefix of the drafts + a bonus token
            d = d or []  # None: a skipped step drafted nothing
            new = d[: rng.randrange(len(d) + 1)] + tokens(1)
            new = new[: max_model_len - len(history[rid])]
            history[rid] += new
            sampled[rid] = new
            unseen[rid] = new if called or plain != "skipped" else unseen[rid] + new
            if len(history[rid]) >= max_model_len or rng.random() < 0.04:
                if not called and plain == "skipped":  # the engine's hand-over of a leaving request's tokens
                    assert proposer.observe(_batch({rid: history[rid]}, {rid: new}, k, max_model_len)) is True
                    ref.add_active_response(rid, unseen[rid])
                del history[rid], sampled[rid], unseen[rid]
                proposer.remove_request(rid)
                ref.stop_request(rid)
    assert set(proposer.cache.active_requests) == set(history)
    assert set(proposer.cache.cached_requests) == set(ref.cached_requests)
    print(f"drafted {drafted} tokens, {mixed_steps} steps with mixed positive lengths")
    assert drafted > 50 // every and mixed_steps > 0, "no step had two requests with different positive draft lengths"


@needs_arctic
@pytest.mark.parametrize("cached", [10000, 0])
def test_deferred_global_updates_reach_the_global_tree(cached):
    """With the option defer_global_updates the global tree's updates wait for while_verifying:
    requests still get drafts from their own trees at once, and once flushed the global tree holds
    what the cache's own updates put there: a later request drafts the same from it as from a
    SuffixDecodingCache driven by hand."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=6,
                                                 suffix_decoding_max_cached_requests=cached,
                                                 defer_global_updates=True))
    assert proposer.defer_global_updates and proposer._native is not None
    ref = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=cached)
    rng = random.Random(3)
    motif = [rng.randrange(2, 30) for _ in range(7)]
    history = {r: [rng.randrange(2, 30) for _ in range(5)] for r in ("a", "b")}
    for rid, h in history.items():
        proposer.add_request(rid, np.asarray(h, dtype=np.int32))
        ref.start_request(rid, h)
    sampled = {rid: [] for rid in history}
    own_tree_drafts = 0
    for step in range(40):
        drafts = proposer.propose(_batch(history, sampled, 6, 512))
        proposer.while_verifying()
        for rid, d in zip(history, drafts.to_lists()):
            if sampled[rid]:
                ref.add_active_response(rid, sampled[rid])
            own_tree_drafts += bool(d)
            new = [motif[(len(history[rid]) + step) % len(motif)]] + ([rng.randrange(2, 30)] if step % 9 == 0 else [])
            history[rid] += new
            sampled[rid] = new
    assert own_tree_drafts > 20
    proposer.propose(_batch(history, sampled, 6, 512))  # the last tokens: pending for the global tree
    for rid in history:
        ref.add_active_response(rid, sampled[rid])
        proposer.remove_request(rid)  # flushes what is pending
        ref.stop_request(rid)
    proposer.add_request("probe", np.asarray([1], dtype=np.int32))
    ref.start_request("probe", [1])
    for rid, h in history.items():
        for end in range(6, len(h), 3):
            context = np.asarray(h[max(0, end - 24): end], dtype=np.int32)
            expected = ref.speculate("probe", context, max_spec_tokens=6, min_token_prob=0.1).token_ids
            assert proposer._native.speculate("probe", context, 6, 1.0, 0.1).token_ids == expected, (rid, end)


@needs_arctic
def test_prefilling_and_max_model_len_get_no_draft():
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=4))
    seq = [5, 6, 7, 8] * 6  # 24 tokens = max_model_len
    history = {"prefilling": seq[:12], "full": seq, "near_full": seq[:22]}
    sampled = {"prefilling": [], "full": seq[23:], "near_full": seq[21:22]}
    for rid, h in history.items():
        proposer.add_request(rid, np.asarray(h[: len(h) - len(sampled[rid])], dtype=np.int32))
    drafts = proposer.propose(_batch(history, sampled, 4, max_model_len=24))
    # near_full has 22 tokens: only 2 more fit, so max_spec_tokens=2 cuts its draft
    assert drafts.to_lists() == [[], [], [7, 8]]


@needs_arctic
def test_lifecycle_and_fifo_eviction():
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=4,
                                                 suffix_decoding_max_cached_requests=2))
    cache = proposer.cache
    proposer.add_request("a", np.arange(2, 10, dtype=np.int64))  # any integer dtype is converted
    proposer.add_request("b", [3, 4, 5])
    assert set(cache.active_requests) == {"a", "b"} and set(cache.cached_requests) == {"a", "b"}
    proposer.remove_request("a")
    proposer.remove_request("a")  # idempotent
    assert set(cache.active_requests) == {"b"} and set(cache.cached_requests) == {"a", "b"}
    proposer.add_request("c", [4, 5, 6])  # a third cached response evicts the oldest one (FIFO)
    assert set(cache.cached_requests) == {"b", "c"}
    proposer.add_request("c", [7, 8])  # re-added id: a new request
    assert set(cache.active_requests) == {"b", "c"}

    no_global = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=4,
                                                  suffix_decoding_max_cached_requests=0))
    no_global.add_request("a", [1, 2, 3])
    assert set(no_global.cache.cached_requests) == set()


@needs_arctic
def test_reset_forgets_cached_responses_and_refuses_while_running():
    """reset() (the seeded-reproducibility workaround) empties the global tree: a request drafts
    after it as in a new proposer. It refuses while a request runs, naming it."""
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=8))
    response = [20, 21, 22, 23, 24, 25, 26, 27]
    proposer.add_request("first", np.asarray([2, 3], dtype=np.int32))
    proposer.propose(_batch({"first": [2, 3, *response]}, {"first": response}, 8, 512))
    with pytest.raises(RuntimeError, match=re.escape("SuffixProposer.reset() needs no running requests, got 1 "
                                                     "(first); call it between generate calls.")):
        proposer.reset()
    proposer.remove_request("first")
    probe = {"second": [4, 5, 20, 21, 22]}, {"second": [20, 21, 22]}, 8, 512
    proposer.add_request("second", np.asarray([4, 5], dtype=np.int32))
    assert proposer.propose(_batch(*probe)).to_lists() == [[23, 24, 25]]  # from the first response
    proposer.remove_request("second")
    proposer.reset()
    assert set(proposer.cache.cached_requests) == set() and proposer._native is not None
    proposer.add_request("second", np.asarray([4, 5], dtype=np.int32))
    assert proposer.propose(_batch(*probe)).to_lists() == [[]]


@needs_arctic
def test_own_tree_is_built_at_the_first_draft_and_observe_feeds_only_the_global_tree():
    """On the native path a request's own tree takes its tokens (prompt first) only when it is drafted for: a
    request the policy keeps plain (observed, then removed) never builds one, yet its response serves later
    requests through the global tree; a request drafted for late drafts from its prompt and every token since."""
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=8))
    from arctic_inference.suffix_decoding._C import SuffixTree

    native = proposer._native
    bare = SuffixTree(proposer.max_tree_depth).estimate_memory()
    prompt, response = [2, 3, 4, 5, 6, 7, 8, 9], [20, 21, 22, 23, 24, 25, 26, 27]
    proposer.add_request("plain", np.asarray(prompt, dtype=np.int32))
    assert native.local["plain"].estimate_memory() == bare  # nothing built at add_request
    hist = list(prompt)
    for t in response:  # observed steps (the engine's hand-over of a request leaving after plain steps)
        hist.append(t)
        assert proposer.observe(_batch({"plain": hist}, {"plain": [t]}, 8, 512)) is True
    assert native.local["plain"].estimate_memory() == bare
    proposer.remove_request("plain")
    proposer.add_request("late", np.asarray([4, 5, 6, 7, 30, 31], dtype=np.int32))
    history = [4, 5, 6, 7, 30, 31, 2, 3, 4, 5]
    drafts = proposer.propose(_batch({"late": history}, {"late": [2, 3, 4, 5]}, 8, 512))
    # its own tree holds its prompt: after "4 5" came "6 7" there (a 2-token match, so 2 drafts)
    assert native.local["late"].estimate_memory() > bare
    assert drafts.to_lists() == [[6, 7]]
    probe = {"next": [40, 20, 21, 22]}, {"next": [20, 21, 22]}, 8, 512
    proposer.add_request("next", np.asarray([40], dtype=np.int32))
    assert proposer.propose(_batch(*probe)).to_lists() == [[23, 24, 25]]  # the plain request's response


@needs_arctic
def test_global_tree_serves_later_requests():
    """A finished request's response is drafted for a later request with the same context."""
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=8))
    response = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    proposer.add_request("first", np.asarray([2, 3], dtype=np.int32))
    hist = [2, 3]
    for t in response:
        hist.append(t)
        proposer.propose(_batch({"first": hist}, {"first": [t]}, 8, 512))
    proposer.remove_request("first")
    proposer.add_request("second", np.asarray([4, 5], dtype=np.int32))
    drafts = proposer.propose(_batch({"second": [4, 5, 20, 21, 22]}, {"second": [20, 21, 22]}, 8, 512))
    assert drafts.to_lists() == [[23, 24, 25]]  # max_spec_factor 1.0: as long as the 3-token match


def test_missing_backend_error_leaves_other_methods_working(tiny_llama_path):
    code = f"""
        import sys
        sys.modules["arctic_inference"] = None  # as if arctic-inference were not installed
        from specdec import LLM, SamplingParams
        try:
            LLM({tiny_llama_path!r}, {{"method": "suffix", "num_speculative_tokens": 3}}, dtype="float32")
        except ImportError as exc:
            print("ERROR:", exc)
        else:
            raise SystemExit("method suffix did not fail without arctic-inference")
        llm = LLM({tiny_llama_path!r}, {{"method": "copycat", "num_speculative_tokens": 3}}, dtype="float32")
        out = llm.generate([[5, 6, 7, 5, 6]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
        print("COPYCAT:", len(out[0].token_ids))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR: method 'suffix' needs arctic-inference==0.3.0" in proc.stdout
    assert "make install" in proc.stdout
    assert "-m pip install cmake ninja nanobind==2.9.2 protobuf==5.29.6 grpcio-tools" in proc.stdout
    assert "-m pip install --no-build-isolation arctic-inference==0.3.0" in proc.stdout
    assert "COPYCAT: 6" in proc.stdout


def _branching_history(proposer, earlier):
    """Earlier responses (after a prompt [0]) in the proposer's cache and in a reference SuffixDecodingCache, and a
    running request "q" with prompt [0, 1, 2] in both; returns the reference."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    ref = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=100)
    for i, seq in enumerate(earlier):
        for cache in (proposer.cache, ref):
            cache.start_request(f"e{i}", [0])
            cache.add_active_response(f"e{i}", seq)
            cache.stop_request(f"e{i}")
    proposer.add_request("q", np.array([0, 1, 2], dtype=np.int32))
    ref.start_request("q", [0, 1, 2])
    return ref


@needs_arctic
def test_tree_speculation_drafts_arctic_inferences_trees():
    """use_tree_spec=True: a context whose suffix was followed by different tokens in earlier responses gets a
    tree with several children of the root, equal (tokens and parents) to SuffixDecodingCache's tree."""
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=6, use_tree_spec=True,
                                                 suffix_decoding_min_token_prob=0.0))
    ref = _branching_history(proposer, [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8, 9], [1, 2, 3, 4, 10, 11],
                                        [1, 2, 3, 7, 8, 12]])
    history = {"q": [0, 1, 2, 3]}
    drafts = proposer.propose(_batch(history, {"q": [3]}, 6, 512))
    ref.add_active_response("q", [3])
    expected = ref.speculate("q", [0, 1, 2, 3], max_spec_tokens=6, min_token_prob=0.0, use_tree_spec=True)
    n = drafts.num_draft_tokens[0]
    assert drafts.token_ids[0, :n].tolist() == expected.token_ids
    assert drafts.parents[0, :n].tolist() == expected.parents
    assert expected.parents.count(-1) >= 2  # a real tree: several children of the root


@needs_arctic
def test_tree_nodes_widens_the_tree_within_depth_k():
    """tree_nodes=N > k: the proposer drafts arctic-inference's N-node tree, and the engine's tree checks cut the
    nodes deeper than k with their subtrees (the rest renumbered), so the verified tree keeps the best continuation
    to depth k and alternatives beside it."""
    from specdec.validation import check_tree_drafts
    from specdec.verify import tree_depths

    k, nodes = 3, 12
    proposer = create_proposer(SpeculativeConfig(method="suffix", num_speculative_tokens=k, use_tree_spec=True,
                                                 tree_nodes=nodes, suffix_decoding_min_token_prob=0.0,
                                                 suffix_decoding_max_spec_factor=8.0))
    assert proposer.max_tree_nodes() == nodes
    ref = _branching_history(proposer, [[1, 2, 3, 4, 5, 6, 13], [1, 2, 3, 7, 8, 9, 14], [1, 2, 3, 4, 10, 11, 15],
                                        [1, 2, 3, 7, 8, 12, 16]])
    batch = _batch({"q": [0, 1, 2, 3]}, {"q": [3]}, k, 512)
    drafts = proposer.propose(batch)
    ref.add_active_response("q", [3])
    full = ref.speculate("q", [0, 1, 2, 3], max_spec_tokens=nodes, max_spec_factor=8.0, min_token_prob=0.0,
                         use_tree_spec=True)
    depth = tree_depths([p + 1 for p in full.parents])[1:]
    assert max(depth) > k  # arctic grew past depth k: the cut matters here
    n = drafts.num_draft_tokens[0]
    assert drafts.token_ids.shape[1] == nodes and n == len(full.token_ids) > k
    assert drafts.token_ids[0, :n].tolist() == full.token_ids and drafts.parents[0, :n].tolist() == full.parents
    keep = [j for j, d in enumerate(depth) if d <= k]
    assert len(keep) > k
    (tokens, parents), = check_tree_drafts(drafts, batch, [k], 1000, proposer, "error")
    assert tokens == [full.token_ids[j] for j in keep]
    assert parents == [keep.index(full.parents[j]) if full.parents[j] >= 0 else -1 for j in keep]
