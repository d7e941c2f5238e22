"""The greedy check: each method's greedy outputs against the baseline's, near-ties in lower precision."""

from __future__ import annotations

from typing import Any

import torch

# ---------------------------------------------------------------- checks


def compare_greedy(base: list[list[int]], other: list[list[int]]) -> dict[str, Any]:
    """Prompts whose output equals the baseline's, the first divergent position of the others, and
    the token agreement (tokens before the first divergence / tokens generated)."""
    if len(base) != len(other):
        raise ValueError(f"{len(other)} outputs to compare with {len(base)} baseline outputs: expected equal counts.")
    diverged, agree, total = [], 0, 0
    for i, (b, o) in enumerate(zip(base, other)):
        j = next((j for j, (x, y) in enumerate(zip(b, o)) if x != y), min(len(b), len(o)))
        if b != o:
            diverged.append({"prompt": i, "position": j})
        agree += j
        total += max(len(b), len(o))
    return {"prompts": len(base), "identical": len(base) - len(diverged), "diverged": diverged,
            "token_agreement": agree / total if total else 1.0}


def tie_bound(top1_logit: float, rel: float) -> float:
    """Largest baseline logit gap that bfloat16 rounding may flip: ``rel x max(1, |top-1 logit|)``.

    A one-token step and a (k+1)-token verify pass round each layer's bfloat16 output differently
    (relative spacing 2^-8..2^-7), and the differences accumulate through the layers. Measured on the
    bundled tiny (4 layers, top-1 logits 8-21): two bfloat16 computation orders differ by <= 0.07 in
    any logit and bfloat16 differs from float32 by <= 0.11, so a gap between two logits moves by
    ~0.2 at most. ``rel=0.05`` (0.4-1.0 there) leaves room for a deeper model's larger accumulated
    error; every gap is kept in the JSON so the bound can be judged against the data (``--tie-rel``)."""
    return rel * max(1.0, abs(top1_logit))


@torch.inference_mode()
def divergence_margins(hf_model: Any, prompts: list[list[int]], base: list[list[int]], other: list[list[int]],
                       diverged: list[dict[str, Any]], rel: float) -> list[dict[str, Any]]:
    """For each divergence: a plain HF forward of prompt + baseline prefix, the baseline's top-2 logit
    margin there, the gap between its top-1 and the token the method chose, and whether that gap is
    within :func:`tie_bound`."""
    out = []
    device = next(hf_model.parameters()).device
    for d in diverged:
        i, j = d["prompt"], d["position"]
        if j >= min(len(base[i]), len(other[i])):
            out.append({**d, "near_tie": False, "note": "lengths differ"})
            continue
        ids = torch.tensor([prompts[i] + base[i][:j]], device=device)
        logits = hf_model(input_ids=ids).logits[0, -1].float()
        top = torch.topk(logits, 2)
        top1 = float(top.values[0])
        gap = top1 - float(logits[other[i][j]])
        bound = tie_bound(top1, rel)
        out.append({**d, "top2_margin": top1 - float(top.values[1]), "chosen_gap": gap, "bound": bound,
                    "near_tie": gap <= bound})
    return out


def check_method(base: list[list[int]], other: list[list[int]], prompts: list[list[int]], dtype: torch.dtype,
                 hf_model_fn: Any, rel: float) -> dict[str, Any]:
    """The greedy check of one method: float32 must match exactly (else ``refused``); lower precision
    must diverge only at near-ties (else ``suspect``)."""
    cmp = compare_greedy(base, other)
    exact = dtype == torch.float32
    result = {**cmp, "dtype": str(dtype).removeprefix("torch."), "refused": exact and bool(cmp["diverged"]),
              "suspect": False, "margins": []}
    if cmp["diverged"]:
        result["margins"] = divergence_margins(hf_model_fn(), prompts, base, other, cmp["diverged"], rel)
        result["suspect"] = not exact and not all(m["near_tie"] for m in result["margins"])
    return result


def check_label(check: dict[str, Any]) -> str:
    n, same = check["prompts"], check["identical"]
    if check["refused"]:
        return f"REFUSED: {n - same}/{n} differ in float32"
    if not check["diverged"]:
        return f"exact {same}/{n}"
    ties = sum(m["near_tie"] for m in check["margins"])
    label = f"agree {check['token_agreement']:.1%}, {ties}/{len(check['margins'])} div at near-ties"
    return label + (" (BUG?)" if check["suspect"] else "")
