"""The course engine: prefill once, then decode one token per step over a KV cache, timing every token.

    engine = Engine("tiny-target")
    [result] = engine.generate(["def fibonacci(n):"], SamplingParams(max_new_tokens=32))
    result.text, result.trace.ttft, result.trace.tpot

Every emitted token carries the ``time.perf_counter()`` at which its id reached the host (that
``.tolist()`` waits for the device), so TTFT/TPOT/throughput come from real events.
Batches are *static* here (all rows start together and the batch runs until its last row ends);
chapter 06 replaces this loop with a scheduler. Introduced in 02_metrics.ipynb.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from course_lib.engine.kv_cache import ContiguousKVCache
from course_lib.engine.model import LlamaEngineModel
from course_lib.engine.sampling import SamplingParams, counts_from_ids, make_generator, sample_next
from course_lib.metrics import RequestTrace


@dataclass
class TokenEvent:
    """One generated token as it happens: which request, which token, when."""

    request: int
    token_id: int
    time: float
    index: int  # 0 for the first generated token of that request


@dataclass
class GenerationResult:
    request_id: int
    prompt_ids: list[int]
    output_ids: list[int]  # generated ids; ends with EOS when finish_reason == "eos"
    text: str
    finish_reason: str  # "eos" or "length"
    trace: RequestTrace


def _penalised(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


class Engine:
    """A minimal inference engine over a ``transformers`` Llama-family checkpoint."""

    def __init__(self, model="tiny-target", tokenizer=None, device: str | torch.device = "cpu",
                 dtype: str = "fp32") -> None:
        if isinstance(model, (str, Path)):
            from course_lib.models.load import load_model

            model, tokenizer = load_model(model, device=device, dtype=dtype)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with a loaded model: Engine(hf_model, tokenizer)")
        self.hf_model = model
        self.tokenizer = tokenizer
        self.model = LlamaEngineModel(model)
        self.device = self.model.device
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # ---------------------------------------------------------------- inputs
    def encode(self, prompts: Sequence[str] | Sequence[Sequence[int]] | str) -> list[list[int]]:
        """Token ids per prompt (strings are tokenized; id lists pass through). Rejects empty prompts."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or len(prompts) == 0:
            raise ValueError("prompts must be a non-empty list of strings or of token-id lists")
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if not p:
                    raise ValueError(f"prompts[{i}] is an empty string; give at least one character")
                ids = self.tokenizer(p)["input_ids"]
            else:
                ids = [int(t) for t in p]
                bad = [t for t in ids if not 0 <= t < self.model.vocab_size]
                if bad:
                    raise ValueError(f"prompts[{i}] has token ids outside [0, {self.model.vocab_size}): {bad[:5]}")
            if not ids:
                raise ValueError(f"prompts[{i}] encodes to zero tokens")
            out.append(ids)
        return out

    def check_fits(self, ids: list[list[int]], max_new_tokens: int) -> None:
        for i, p in enumerate(ids):
            if len(p) + max_new_tokens > self.model.max_position:
                raise ValueError(f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                                 f"the context window of {self.model.max_position} tokens")

    def new_cache(self, batch: int, max_len: int) -> ContiguousKVCache:
        m = self.model
        return ContiguousKVCache(m.num_layers, batch, max_len, m.num_kv_heads, m.head_dim, m.dtype, m.device)

    def _pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded (B, T) ids and (B,) lengths."""
        lens = torch.tensor([len(r) for r in rows], device=self.device)
        x = torch.full((len(rows), int(lens.max())), self.pad_id, dtype=torch.long, device=self.device)
        for b, r in enumerate(rows):
            x[b, : len(r)] = torch.tensor(r, device=self.device)
        return x, lens

    # ---------------------------------------------------------------- steps
    @torch.inference_mode()
    def prefill(self, rows: list[list[int]], cache: ContiguousKVCache) -> torch.Tensor:
        """Process whole prompts in one forward (compute-bound); logits of each row's last token (B, V)."""
        x, lens = self._pad(rows)
        logits = self.model(x, cache, logits_at=(lens - 1)[:, None])[:, 0]  # (B, V)
        cache.advance(lens)
        return logits

    @torch.inference_mode()
    def decode_step(self, tokens: torch.Tensor, cache: ContiguousKVCache) -> torch.Tensor:
        """One new token per row (B,) → next logits (B, V). Reads every weight and the whole cache."""
        logits = self.model(tokens[:, None], cache)[:, 0]  # (B, V)
        cache.advance(1)
        return logits

    @torch.inference_mode()
    def _recompute(self, rows: list[list[int]]) -> torch.Tensor:
        """No KV cache: run the whole sequence again and keep the last logits (chapter 05's baseline)."""
        x, lens = self._pad(rows)
        return self.model(x, None, logits_at=(lens - 1)[:, None])[:, 0]

    # ---------------------------------------------------------------- loops
    def events(self, ids: list[list[int]], params: SamplingParams, use_kv_cache: bool = True,
               arrival: float | None = None) -> Iterator[TokenEvent]:
        """Generate for a static batch, yielding each token as soon as it is on the host."""
        if params.num_beams > 1:
            raise ValueError("num_beams > 1: use Engine.beam_search (it returns whole sequences, not a stream)")
        self.check_fits(ids, params.max_new_tokens)
        B = len(ids)
        generator = make_generator(params.seed, self.device) if params.seed is not None and not params.greedy else None
        penal = _penalised(params)
        if penal:
            x, _ = self._pad(ids)
            prompt_counts = counts_from_ids(x, self.model.vocab_size, pad_id=self.pad_id)
            output_counts = torch.zeros_like(prompt_counts)
        else:
            prompt_counts = output_counts = None
        seqs = [list(p) for p in ids]
        n_out = [0] * B
        done = [False] * B
        cache = None
        if use_kv_cache:
            cache = self.new_cache(B, max(len(p) for p in ids) + params.max_new_tokens)
            logits = self.prefill(ids, cache)
        else:
            logits = self._recompute(seqs)
        for _ in range(params.max_new_tokens):
            tok = sample_next(logits, params, generator=generator, prompt_counts=prompt_counts,
                              output_counts=output_counts)  # (B,)
            tok_list = tok.tolist()  # waits for the device: the token exists now
            now = time.perf_counter()
            for b, t in enumerate(tok_list):
                if done[b]:
                    continue
                seqs[b].append(t)
                yield TokenEvent(b, t, now, n_out[b])
                n_out[b] += 1
                if (t in self.eos_ids and not params.ignore_eos) or n_out[b] >= params.max_new_tokens:
                    done[b] = True
            if all(done):
                return
            if output_counts is not None:
                output_counts[torch.arange(B), tok] += 1
            if use_kv_cache:
                logits = self.decode_step(tok, cache)
            else:
                logits = self._recompute(seqs)

    def generate(self, prompts, params: SamplingParams | None = None, *, use_kv_cache: bool = True,
                 on_token: Callable[[TokenEvent], None] | None = None) -> list[GenerationResult]:
        """Generate for every prompt as one static batch; results in prompt order, each with its trace."""
        arrival = time.perf_counter()
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = self.encode(prompts)
        self.check_fits(ids, params.max_new_tokens)
        outputs: list[list[int]] = [[] for _ in ids]
        times: list[list[float]] = [[] for _ in ids]
        for ev in self.events(ids, params, use_kv_cache):
            outputs[ev.request].append(ev.token_id)
            times[ev.request].append(ev.time)
            if on_token is not None:
                on_token(ev)
        results = []
        for i, (p, out) in enumerate(zip(ids, outputs)):
            eos_hit = bool(out) and out[-1] in self.eos_ids and not params.ignore_eos
            trace = RequestTrace(request_id=i, arrival=arrival, prompt_tokens=len(p), token_times=times[i],
                                 finish=times[i][-1] if times[i] else None)
            results.append(GenerationResult(i, p, out, self.tokenizer.decode(out, skip_special_tokens=True),
                                            "eos" if eos_hit else "length", trace))
        return results

    def stream(self, prompt: str, params: SamplingParams | None = None) -> Iterator[tuple[str, TokenEvent]]:
        """Yield (text piece, event) per token of one prompt, decoding text incrementally."""
        params = params or SamplingParams()
        ids = self.encode([prompt])
        out: list[int] = []
        shown = ""
        for ev in self.events(ids, params):
            out.append(ev.token_id)
            text = self.tokenizer.decode(out, skip_special_tokens=True)
            if text.endswith("\ufffd") and ev.index + 1 < params.max_new_tokens:
                piece = ""  # a multi-byte character is split across tokens: wait for its other bytes
            else:
                piece, shown = text[len(shown):], text
            yield piece, ev

    # ---------------------------------------------------------------- beam search
    @torch.inference_mode()
    def beam_search(self, prompt, num_beams: int = 4, max_new_tokens: int = 32, length_penalty: float = 1.0,
                    ignore_eos: bool = False) -> list[int]:
        """Keep the ``num_beams`` best partial sequences by total log-probability (seed 003's beam decoding).

        Finished hypotheses (ending in EOS) are scored sum_logprob / generated_len ** length_penalty.
        Returns the best generated ids. With ``ignore_eos`` EOS is never chosen.
        """
        params = SamplingParams(num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty)
        [ids] = self.encode([prompt] if isinstance(prompt, str) else [prompt])
        self.check_fits([ids], params.max_new_tokens)
        cache = self.new_cache(1, len(ids) + max_new_tokens)
        logits = self.prefill([ids], cache)  # (1, V)
        cache.reorder(torch.zeros(num_beams, dtype=torch.long, device=self.device))
        logits = logits.expand(num_beams, -1)
        scores = torch.full((num_beams,), -math.inf, device=self.device)
        scores[0] = 0.0  # all beams start identical: only one may expand at first
        beams: list[list[int]] = [[] for _ in range(num_beams)]
        finished: list[tuple[float, list[int]]] = []
        V = logits.shape[-1]
        for step in range(max_new_tokens):
            logp = torch.log_softmax(logits.float(), dim=-1)  # (nb, V)
            if ignore_eos:
                logp[:, list(self.eos_ids)] = -math.inf
            cand = (scores[:, None] + logp).flatten()  # (nb*V,)
            top_scores, top_idx = cand.topk(2 * num_beams)
            next_rows, next_tokens, next_scores = [], [], []
            for rank, (s, flat) in enumerate(zip(top_scores.tolist(), top_idx.tolist())):
                row, tok = divmod(flat, V)
                if tok in self.eos_ids:
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
            beams = [beams[r] + [t] for r, t in zip(next_rows, next_tokens)]
            scores = torch.tensor(next_scores, device=self.device)
            rows = torch.tensor(next_rows, device=self.device)
            cache.reorder(rows)
            if step + 1 < max_new_tokens:
                logits = self.decode_step(torch.tensor(next_tokens, device=self.device), cache)
        for s, b in zip(scores.tolist(), beams):
            finished.append((s / max(1, len(b)) ** length_penalty, b))
        return max(finished, key=lambda f: f[0])[1]
