"""Beam search on the course engine: the ``num_beams`` best partial sequences, sharing KV storage by ``fork``.

Xiao & Zhu's beam decoding driven directly on the engine's ``forward`` and attention backend, not through
the scheduler: one prefill of the prompt, then each step scores every beam's next token, keeps the best
``num_beams`` continuations, lets a parent's first child take its storage, ``fork``s it for later children
(copy-on-write blocks on the paged backend, a copied row on the contiguous one) and ``free``s beams no
child continues. Each step is a decode of ``num_beams`` rows: bandwidth-bound like any decode.
``Engine.beam_search`` calls it. Introduced in 04_decoding.ipynb; its KV sharing is measured in
05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import math

import torch

from course_lib.engine.sampling import SamplingParams


@torch.inference_mode()
def beam_search(
    engine,
    prompt,
    num_beams: int = 4,
    max_new_tokens: int = 32,
    length_penalty: float = 1.0,
    ignore_eos: bool = False,
) -> list[int]:
    """Keep the ``num_beams`` best partial sequences by total log-probability (Xiao & Zhu's beam decoding).

    Finished hypotheses (ending in EOS) are scored sum_logprob / generated_len ** length_penalty.
    Returns the best generated ids. With ``ignore_eos`` EOS is never chosen. Beams share the prompt's
    KV by ``fork``; a beam that no child continues is ``free``d. ``engine``: an ``Engine`` (its scheduler
    is not used; the storage comes from its backend).
    """
    params = SamplingParams(num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty)
    [ids] = engine.encode([prompt] if isinstance(prompt, str) else [prompt])
    engine.check_fits([ids], params.max_new_tokens)
    kv = engine.backend
    if not kv.stores_kv:
        raise RuntimeError("beam_search needs a backend that stores KV")
    root = kv.allocate()
    handles = [root]
    try:
        kv.append(root, len(ids))
        logits = engine.forward([root], [ids], [0])  # (1, V)
        scores = torch.zeros(1, device=engine.device)
        beams: list[list[int]] = [[]]
        finished: list[tuple[float, list[int]]] = []
        for step in range(max_new_tokens):
            logp = torch.log_softmax(logits.float(), dim=-1)  # (nb, V)
            V = logp.shape[-1]
            if ignore_eos:
                logp[:, list(engine.eos_ids)] = -math.inf
            cand = (scores[:, None] + logp).flatten()  # (nb*V,)
            top_scores, top_idx = cand.topk(2 * num_beams)
            next_rows, next_tokens, next_scores = [], [], []
            for rank, (s, flat) in enumerate(zip(top_scores.tolist(), top_idx.tolist())):
                row, tok = divmod(flat, V)
                if tok in engine.eos_ids:
                    if rank < num_beams:  # an EOS outside the top num_beams is not a real candidate
                        finished.append((s / (step + 1) ** length_penalty, beams[row] + [tok]))
                    continue
                next_rows.append(row)
                next_tokens.append(tok)
                next_scores.append(s)
                if len(next_rows) == num_beams:
                    break
            best_running = max(next_scores) / (step + 1) ** length_penalty
            if finished and max(f[0] for f in finished) >= best_running and length_penalty >= 0:
                break  # no running beam can still beat the best finished one (scores only fall)
            new_handles, used = [], set()
            for r in next_rows:  # a parent's first child takes its storage, later children fork it
                new_handles.append(kv.fork(handles[r]) if r in used else handles[r])
                used.add(r)
            for r, h in enumerate(handles):
                if r not in used:
                    kv.free(h)
            handles = new_handles
            beams = [beams[r] + [t] for r, t in zip(next_rows, next_tokens)]
            scores = torch.tensor(next_scores, device=engine.device)
            if step + 1 < max_new_tokens:
                for h in handles:
                    kv.append(h, 1)
                logits = engine.forward(handles, [[t] for t in next_tokens], [kv.length(h) - 1 for h in handles])
        for s, b in zip(scores.tolist(), beams):
            finished.append((s / max(1, len(b)) ** length_penalty, b))
        return max(finished, key=lambda f: f[0])[1]
    finally:
        for h in handles:
            kv.free(h)
