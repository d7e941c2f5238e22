"""An EAGLE head's wide catch-up (a prompt, or a plain run of the speculation policy) on the lean chain: the keys-only
catch-up that ``GreedyHeadChain.draft`` runs now, against a full head forward over every position (what it ran
before: queries, attention over the slot's context, output projection and MLP at each position, of which only the
last one's output is read), same process, same head and inputs.

    python benchmarks/eagle_catch_up.py                     # CPU, the bundled tiny target's eagle3 head
    python benchmarks/eagle_catch_up.py --batch 1 8 --width 64 512 --context 100

Each row: best of ``--repeats`` timed calls of each way (after one untimed call), in milliseconds, and their ratio.
"keys only" is the whole ``draft`` call (the catch-up and the chain's k - 1 head steps); "full catch-up" is the
catch-up forward alone, so the ratio understates the saving by the chain's steps.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--width", type=int, nargs="+", default=[64, 512], help="catch-up positions per request")
    ap.add_argument("--context", type=int, default=100, help="head positions already committed before them")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from specdec import bundled_model
    from specdec_eagle.chain import GreedyHeadChain
    from specdec_eagle.heads import HeadKVCache
    from specdec_eagle.loader import TargetInfo, load_head

    target = AutoModelForCausalLM.from_pretrained(bundled_model("tiny"))
    cfg = target.config
    info = TargetInfo(int(cfg.hidden_size), int(cfg.vocab_size), int(cfg.num_hidden_layers))
    head = load_head(bundled_model("tiny-eagle3"), "eagle3", info, target.get_input_embeddings(), None).head.eval()
    capacity = args.context + max(args.width) + args.k + 1
    print("| batch | positions | keys only ms | full catch-up ms | full / keys only |")
    print("| --- | --- | --- | --- | --- |")
    for b in args.batch:
        for w in args.width:
            cache = HeadKVCache(head.cfg, b, capacity, torch.float32, "cpu")
            chain = GreedyHeadChain(head, capacity)
            tokens = torch.randint(0, head.cfg.vocab_size, (b, w))
            feats = torch.randn(b, w, head.cfg.feature_size)
            pos = args.context + np.arange(w)[None, :].repeat(b, 0)
            valid = np.ones((b, w), dtype=bool)
            slots = list(range(b))

            ways = (("keys", chain.draft, (cache, slots, tokens, feats, pos, valid, args.k)),
                    ("full", chain._catch_up, (cache, torch.arange(b), True, tokens, feats, pos, valid, False)))
            best = {}
            for name, fn, fn_args in ways:
                times = []
                with torch.inference_mode():
                    fn(*fn_args)
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        fn(*fn_args)
                        times.append(time.perf_counter() - t)
                best[name] = min(times)
            print(f"| {b} | {w} | {best['keys'] * 1e3:.2f} | {best['full'] * 1e3:.2f} | "
                  f"{best['full'] / best['keys']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
