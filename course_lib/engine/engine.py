"""The engine loop: requests in, one ``step()`` at a time, tokens out with their timestamps.

    engine = Engine("tiny-target")
    engine.add_request("def fibonacci(n):", SamplingParams(max_new_tokens=32))
    while engine.has_unfinished():
        for event in engine.step():        # schedule → one forward over the flat batch → sample → postprocess
            print(event.request, event.token_id, event.time)

``generate`` / ``events`` / ``stream`` are thin wrappers around that loop (``generation.py``), and ``beam_search`` (in
``beam_search.py``) drives the same forward and KV storage directly. Every emitted token carries the
``time.perf_counter()`` at which its id reached the host (``.tolist()`` waits for the device), so
TTFT/TPOT/throughput come from real events. Requests may be added between steps: with the ``continuous``
policy they join the running batch at the next step. Introduced in 02_metrics_1_latency.ipynb; the
architecture is drawn in ``engine/README.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Sequence as SequenceABC
from pathlib import Path

import torch

from course_lib.core.memory import trim_heap
from course_lib.engine import generation as _gen
from course_lib.engine.attention import AttentionBackend, ContiguousBackend
from course_lib.engine.beam_search import beam_search as _beam_search
from course_lib.engine.fast_decode import DECODE_MODES, FastDecoder
from course_lib.engine.generation import GenerationResult  # noqa: F401 - the engine's result type, named here too
from course_lib.engine.layers import PackedLinear, SkinnyLinear
from course_lib.engine.model import LINEAR_NAMES, LlamaEngineModel, check_supported
from course_lib.engine.parallel_sampling import fork_samples, sample_ids
from course_lib.engine.sampler import Sampler
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from course_lib.engine.sequence import Sequence, TokenEvent
from course_lib.engine.structured import Grammars  # TokenEvent: what step() returns, named here too

LINEAR_CHOICES = ("auto", "reference", "skinny", "packed")
KV_CACHE_CHOICES = ("contiguous", "paged")


def _free_hf_linears(layer) -> None:
    """Point one HF decoder layer's projection weights at meta tensors, so the packed copies are the only
    ones (the embedding stays: the engine reads it, and a tied LM head shares it)."""
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for module in (layer.self_attn, layer.mlp):
        for name in names:
            lin = getattr(module, name, None)
            if lin is not None:
                meta = torch.empty(lin.weight.shape, dtype=lin.weight.dtype, device="meta")
                lin.weight = torch.nn.Parameter(meta, requires_grad=False)


class Engine:
    """A minimal inference engine over a ``transformers`` Llama-family checkpoint, shaped like vLLM's."""

    def __init__(
        self,
        model="tiny-target",
        tokenizer=None,
        device: str | torch.device = "cpu",
        dtype: str = "fp32",
        config: SchedulerConfig | None = None,
        backend: AttentionBackend | None = None,
        linear: str = "auto",
        kv_cache: str = "contiguous",
        block_size: int = 16,
        prefix_caching: bool = False,
        pack_tied_head: bool = True,
        decode: str = "auto",
    ) -> None:
        """``linear``: "reference" (``F.linear`` everywhere), "skinny" (``layers.SkinnyLinear``: decode-shaped
        products routed to the fastest CPU kernel), "packed" (``layers.PackedLinear``: the same kernel for every
        shape, and the plain weights freed, the HF model's included: half the memory of "skinny", but
        ``hf_model`` keeps only its config and embedding and can no longer run) or "auto" (skinny for fp32 on
        a CPU, else reference).
        ``kv_cache``: "contiguous" (one max-length slab per sequence) or "paged" (``PagedBackend``: blocks of
        ``block_size`` tokens from a shared pool, chapter 05); ignored when ``backend`` is given.
        ``prefix_caching``: reuse the cached KV blocks of a matching prompt prefix (chapter 06); needs
        ``kv_cache="paged"``, or a ``backend`` built with ``PagedBackend(..., prefix_caching=True)``.
        ``pack_tied_head``: with ``linear="packed"``, whether a tied LM head gets its own packed copy (fastest)
        or stays ``F.linear`` on the embedding it shares (one vocab × hidden copy less: 113 MB on SmolLM2).
        ``decode``: "auto" (the default: the fastest path this machine has, ``fast_decode.auto_decode``; a step
        it cannot take runs the next one; ``decode_path`` says which ran), "eager" (the reference forward),
        "fused", "compiled" or "cudagraph" (``fast_decode.py``: a pure decode step on the contiguous cache in
        fewer ops), or "native" (a CPU: the whole step in one C call, ``native_step.py``); any other step
        runs the reference."""
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        if linear not in LINEAR_CHOICES:
            raise ValueError(f"linear must be one of {LINEAR_CHOICES}, got {linear!r}")
        if kv_cache not in KV_CACHE_CHOICES:
            raise ValueError(f"kv_cache must be one of {KV_CACHE_CHOICES}, got {kv_cache!r}")
        if not isinstance(pack_tied_head, bool):
            raise ValueError(f"pack_tied_head must be a bool, got {pack_tied_head!r}")
        if not isinstance(prefix_caching, bool):
            raise ValueError(f"prefix_caching must be a bool, got {prefix_caching!r}")
        if prefix_caching and backend is None and kv_cache != "paged":
            raise ValueError(
                f"prefix_caching=True needs kv_cache='paged' (blocks that sequences can share), got kv_cache={kv_cache!r}"
            )
        if prefix_caching and backend is not None and not getattr(backend, "prefix_caching", False):
            raise ValueError(
                f"prefix_caching=True needs a backend that caches prefixes, e.g. PagedBackend(..., "
                f"prefix_caching=True); {type(backend).__name__} given does not"
            )
        if config is not None and not isinstance(config, SchedulerConfig):
            raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        if linear == "packed" and (str(device) != "cpu" or dtype not in ("fp32", "float32", torch.float32)):
            raise ValueError(
                f"linear='packed' needs device='cpu' and dtype='fp32', got device={device!r}, dtype={dtype!r}"
            )
        if linear == "packed" and not torch.backends.mkldnn.is_available():
            raise ValueError("linear='packed' needs torch built with oneDNN (torch.backends.mkldnn); use linear='auto'")
        if isinstance(model, (str, Path)):
            from course_lib.models.load import load_model

            model, tokenizer = load_model(model, device=device, dtype=dtype)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with a loaded model: Engine(hf_model, tokenizer)")
        check_supported(model.config)
        self.hf_model = model
        self.tokenizer = tokenizer
        self.model = LlamaEngineModel(model)
        self.device = self.model.device
        m = self.model
        if linear == "skinny" or (linear == "auto" and m.device.type == "cpu" and m.dtype == torch.float32):
            for name, lin in list(m.linears()):
                m.set_linear(name, SkinnyLinear.from_linear(lin))
        elif linear == "packed":
            for i, layer in enumerate(model.model.layers):  # layer by layer: the peak is one layer's copy
                for name in LINEAR_NAMES:
                    setattr(m.layers[i], name, PackedLinear.from_linear(getattr(m.layers[i], name)))
                _free_hf_linears(layer)
            tied = m.lm_head.weight.data_ptr() == m.embed_weight.data_ptr()
            if pack_tied_head or not tied:
                m.set_linear("lm_head", PackedLinear.from_linear(m.lm_head))
        trim_heap()  # the fused copies' originals (and any plain weights) go back to the OS
        config = config or SchedulerConfig()
        if config.max_model_len is None:
            config = dataclasses.replace(config, max_model_len=m.max_position)
        elif config.max_model_len > m.max_position:
            raise ValueError(
                f"SchedulerConfig.max_model_len={config.max_model_len} exceeds the model's context "
                f"window of {m.max_position} tokens"
            )
        self.config = config
        if backend is None and kv_cache == "paged":
            from course_lib.engine.attention.paged import PagedBackend

            # max_kv_tokens (or seqs × len) in blocks
            backend = PagedBackend.for_model(m, config, block_size, prefix_caching=prefix_caching)
        if backend is None:
            # the contiguous cache reserves max_model_len slots per sequence: the KV budget buys whole rows
            rows = config.max_num_seqs
            if config.max_kv_tokens is not None:
                rows = min(rows, config.max_kv_tokens // config.max_model_len)
                if rows == 0:
                    raise ValueError(
                        f"SchedulerConfig.max_kv_tokens={config.max_kv_tokens} cannot hold one sequence of "
                        f"max_model_len={config.max_model_len} tokens in a contiguous cache; raise it "
                        f"or lower max_model_len"
                    )
            backend = ContiguousBackend(
                m.num_layers, m.num_kv_heads, m.head_dim, config.max_model_len, rows, m.dtype, m.device
            )
        self.backend = backend
        self.fast = FastDecoder(m, decode) if decode != "eager" else None
        if not isinstance(self.backend, AttentionBackend):
            raise ValueError(f"backend must be an AttentionBackend, got {type(self.backend).__name__}")
        self.scheduler = Scheduler(config, self.backend)
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self.sampler = Sampler(self.eos_ids)
        self._live: dict[str | int, Sequence] = {}  # unfinished requests by id
        self._grammars: Grammars | None = None
        self._auto_ids = itertools.count()

    @property
    def decode_path(self) -> str:
        """Which decode path this engine asked for and which ran, e.g. "auto -> native (the course's C kernels
        built: ...); steps so far: native 63, reference 1" (prefill and mixed steps run the reference)."""
        if self.fast is None:
            return "eager: every step runs the reference forward"
        head = self.fast.requested
        if self.fast.auto:
            head += f" -> {self.fast.mode} ({self.fast.auto_why})"
        elif self.fast.mode != self.fast.requested:
            head += f" -> {self.fast.mode} (fell back)"
        ran = ", ".join(f"{k} {v}" for k, v in sorted(self.fast.ran.items(), key=lambda kv: -kv[1]))
        return f"{head}; decode steps so far: {ran or 'none'}"

    # ---------------------------------------------------------------- inputs
    def encode(self, prompts: SequenceABC[str] | SequenceABC[SequenceABC[int]] | str) -> list[list[int]]:
        """Token ids per prompt (strings are tokenized; id lists pass through). Rejects empty prompts."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, SequenceABC) or len(prompts) == 0:
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
        """Reject, before any work, a request the context window or the KV storage can never hold."""
        limit = self.config.max_model_len
        kv_limit = self.backend.max_tokens_per_seq()
        if max_new_tokens is None:  # until the context ends: the prompt must leave room for one token
            max_new_tokens = 1
        for i, p in enumerate(ids):
            if len(p) + max_new_tokens > limit:
                raise ValueError(
                    f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                    f"the context window of {limit} tokens"
                )
            if len(p) + max_new_tokens > kv_limit:
                raise ValueError(
                    f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it needs more "
                    f"KV storage than the whole cache holds for one sequence ({kv_limit} tokens)"
                )
            kv_budget = self.config.max_kv_tokens
            if kv_budget is not None and self.backend.stores_kv and len(p) + max_new_tokens > kv_budget:
                raise ValueError(
                    f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it needs more "
                    f"KV storage than SchedulerConfig.max_kv_tokens={kv_budget} allows for all sequences together"
                )
            if (
                not (self.config.chunked_prefill and self.backend.stores_kv)
                and len(p) + max_new_tokens > self.config.max_num_batched_tokens
            ):
                raise ValueError(
                    f"prompts[{i}] has {len(p)} tokens, more than max_num_batched_tokens="
                    f"{self.config.max_num_batched_tokens} with chunked prefill off: it could never run"
                )

    def room(self, num_prompt_tokens: int) -> int:
        """Tokens a request with this prompt may generate: what the context window and the KV storage leave."""
        limits = [self.config.max_model_len, self.backend.max_tokens_per_seq()]
        if self.config.max_kv_tokens is not None and self.backend.stores_kv:
            limits.append(self.config.max_kv_tokens)
        if not (self.config.chunked_prefill and self.backend.stores_kv):
            limits.append(self.config.max_num_batched_tokens)
        return min(limits) - num_prompt_tokens

    @staticmethod
    def _check_params(params, where: str = "params") -> SamplingParams:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"{where} must be a SamplingParams, got {type(params).__name__}")
        if params.num_beams > 1:
            raise ValueError(
                f"{where}.num_beams={params.num_beams}: use Engine.beam_search (it returns whole "
                "sequences, not a stream)"
            )
        return params

    # ---------------------------------------------------------------- the step loop
    def add_request(
        self,
        prompt,
        params: SamplingParams | None = None,
        request_id: str | int | None = None,
        arrival: float | None = None,
    ) -> Sequence:
        """Queue one request (a string or token ids); it runs from the next ``step()``. Bad input raises
        ``ValueError`` here, before anything is queued, and leaves every other request untouched.
        ``params.max_new_tokens=None``: until the context (or KV room) ends; ``params.n > 1``: n samples forked
        once the prompt is done (``parallel_sampling.py``), sample j's events under ``sample_id(request_id, j)``."""
        params = self._check_params(params or SamplingParams())
        if isinstance(prompt, str) or (
            isinstance(prompt, SequenceABC) and (not prompt or not isinstance(prompt[0], str))
        ):
            [ids] = self.encode([prompt])
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        self.check_fits([ids], params.max_new_tokens)
        if params.max_new_tokens is None:  # until the context (or the KV room) ends, as vLLM's default
            room = self.room(len(ids))
            if params.min_tokens > room:
                raise ValueError(
                    f"min_tokens={params.min_tokens} exceeds the {room} tokens the context window leaves "
                    f"after the prompt's {len(ids)}"
                )
            params = dataclasses.replace(params, max_new_tokens=room)
        V = self.model.vocab_size
        bad = [t for t, _ in params.logit_bias if not 0 <= t < V]
        if bad:
            raise ValueError(f"logit_bias has token ids outside the vocabulary [0, {V}): {bad[:5]}")
        if params.logprobs is not None and params.logprobs > V:
            raise ValueError(f"logprobs={params.logprobs} exceeds the vocabulary size {V}")
        grammar = self.grammars.grammar(params.structured) if params.structured is not None else None
        if request_id is None:
            request_id = next(self._auto_ids)
            while any(r in self._live for r in sample_ids(request_id, params.n)):
                request_id = next(self._auto_ids)
        elif any(r in self._live for r in sample_ids(request_id, params.n)):
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request (or its samples)")
        seq = Sequence(request_id, ids, params, time.perf_counter() if arrival is None else arrival, self.device)
        seq.grammar = grammar
        self._live[request_id] = seq
        self.scheduler.add(seq)
        return seq

    @property
    def grammars(self) -> Grammars:
        """The grammar compiler of structured requests (``structured.py``), built on first use."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, self.model.vocab_size, sorted(self.eos_ids))
        return self._grammars

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str | int) -> None:
        """Drop an unfinished request (all its samples, with ``n > 1``) and free its KV storage."""
        seqs = [s for s in self._live.values() if s.request_id == request_id or s.parent == request_id]
        if not seqs:
            raise ValueError(f"no unfinished request with id {request_id!r}")
        now = time.perf_counter()
        for seq in seqs:
            self._live.pop(seq.request_id, None)
            self.scheduler.finish(seq, "abort", now)

    @torch.inference_mode()
    def step(self) -> list[TokenEvent]:
        """schedule → one forward over the scheduled tokens → sample → postprocess. [] when idle."""
        batch = self.scheduler.schedule()  # now=None: the scheduler reads time.perf_counter(), the engine's clock
        if not batch.seqs:
            hold = self.scheduler.wait_time()  # dynamic batching holds the waiting requests for a fuller batch
            if 0 < hold < math.inf:
                time.sleep(min(hold, self.config.max_wait_s))  # instead of spinning until the deadline
            return []
        done = [seq.num_cached_tokens + n == seq.num_tokens for seq, n in zip(batch.seqs, batch.num_tokens)]
        logits = self.execute(batch, done)  # (M, V): one row per sequence whose prompt is now complete
        to_sample = [seq for seq, d in zip(batch.seqs, done) if d]
        keeps_kv = self.backend.stores_kv
        for seq, n in zip(batch.seqs, batch.num_tokens):
            seq.num_cached_tokens = seq.num_cached_tokens + n if keeps_kv else 0
        rows = list(range(len(to_sample)))
        for i, seq in enumerate(list(to_sample)):  # n > 1: the other samples fork off once the prompt is done
            if seq.params.n > 1 and not seq.forked:
                forks = fork_samples(self, seq)
                to_sample += forks
                rows += [i] * len(forks)
        if len(rows) > logits.shape[0]:
            logits = logits[torch.tensor(rows, device=logits.device)]  # (M + forks, V): a fork draws from its row
        out = self.sampler(logits, to_sample) if to_sample else None
        ids = out.ids.tolist() if to_sample else []  # waits for the device
        now = time.perf_counter()
        events = []
        for k, (seq, tok) in enumerate(zip(to_sample, ids)):
            lp, top = out.logprobs[k] if out.logprobs and out.logprobs[k] else (None, None)
            if lp is not None:
                seq.cumulative_logprob += lp
            seq.token_ids.append(tok)
            seq.token_times.append(now)
            if seq.grammar is not None:
                seq.grammar.accept(tok)
            reason = self._finish_reason(seq, tok)
            index = seq.num_output_tokens - 1
            first = seq.first_scheduled if index == 0 else None
            events.append(TokenEvent(seq.request_id, tok, now, index, reason is not None, reason, lp, top, first))
            if reason is not None:
                self.scheduler.finish(seq, reason, now)
                self._live.pop(seq.request_id, None)
        return events

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        if tok in self.eos_ids and not p.ignore_eos:
            return "eos"
        if p.stop and seq.num_output_tokens >= p.min_tokens:
            longest = max(len(s) for s in p.stop)
            tail = self.tokenizer.decode(seq.output_ids[-(longest + 8) :], skip_special_tokens=True)
            if any(s in tail for s in p.stop):
                return "stop"
        if seq.num_output_tokens >= p.max_new_tokens:
            return "length"
        return None

    def execute(self, batch: ScheduledBatch, want_logits: list[bool] | None = None) -> torch.Tensor:
        """One forward over the flat batch; logits (M, V) of the last new token of each sequence flagged in
        ``want_logits`` (default: all)."""
        starts = [seq.num_cached_tokens for seq in batch.seqs]
        chunks = [seq.token_ids[s : s + n] for seq, s, n in zip(batch.seqs, starts, batch.num_tokens)]
        return self.forward([seq.kv for seq in batch.seqs], chunks, starts, want_logits)

    def forward(
        self, handles: list, chunks: list[list[int]], starts: list[int], want_logits: list[bool] | None = None
    ) -> torch.Tensor:
        """Run ``chunks[i]`` (new token ids of sequence i, at positions ``starts[i]...``) as one flat batch.
        Storage must already have room (``backend.append``). Returns logits (M, V) as in ``execute``."""
        fast = self.fast
        if fast is not None and all(len(c) == 1 for c in chunks) and (want_logits is None or all(want_logits)):
            if fast.supports(self.backend, [1] * len(chunks), [s + 1 for s in starts]):
                return fast(self.backend, handles, [c[0] for c in chunks], list(starts))
        flat: list[int] = []
        positions: list[int] = []
        for chunk, s in zip(chunks, starts):
            flat += chunk
            positions += range(s, s + len(chunk))
        dev = self.device
        input_ids = torch.tensor(flat, device=dev)  # (N,)
        pos = torch.tensor(positions, device=dev)  # (N,)
        lens = [len(c) for c in chunks]
        meta = self.backend.prepare(handles, lens, pos)
        want = want_logits if want_logits is not None else [True] * len(chunks)
        index = None
        if not (all(want) and len(flat) == len(chunks)):  # some rows have more than one token, or no logits
            ends = list(itertools.accumulate(lens))
            index = torch.tensor([e - 1 for e, w in zip(ends, want) if w], dtype=torch.long, device=dev)  # (M,)
        return self.model(input_ids, pos, meta, self.backend, logits_indices=index)

    def kv_usage(self) -> dict[str, int]:
        """Bytes of KV cache holding tokens vs reserved for the live sequences."""
        return {"used": self.backend.bytes_used(), "reserved": self.backend.bytes_reserved()}

    # ---------------------------------------------------------------- wrappers: generation.py
    _backend = _gen.swap_backend  # (use_kv_cache): the no-cache baseline's backend, for the run of a wrapper
    _params_list = _gen.params_list
    events = _gen.events  # (ids, params, use_kv_cache, arrival): every token of these prompts as it happens
    generate = _gen.generate  # (prompts, params, *, use_kv_cache, on_token) -> [GenerationResult]
    stream = _gen.stream  # (prompt, params): (text piece, event) per token

    # ---------------------------------------------------------------- beam search
    beam_search = _beam_search  # (prompt, num_beams=4, max_new_tokens=32, ...): beam_search.py, on this engine
