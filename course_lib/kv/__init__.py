"""Chapter 05, the KV cache: what it saves and costs, how fewer KV heads shrink it, and what paging saves.

``formulas`` (bytes, requests that fit, FLOPs with and without the cache), ``on_off`` (cache on vs off on
the engine), ``recompute`` (one step with and without the cache on the chat model, beside its roofline
floor), ``engine_check`` (the formula against the engine's tensors), ``budget`` (tokens and sequences a
memory budget holds, MHA vs GQA vs MQA), ``explorer`` (the ipywidgets
calculator), ``heads_timing`` / ``heads_pooling`` / ``uptraining`` (MHA vs GQA vs MQA: decode time, K/V
head pooling, uptraining; command line ``python -m course_lib.kv.cli``), ``paged_memory`` / ``paged_timing`` / ``paged_serving``
(fragmentation and sharing, the paged step's cost, a paged pool swapped into a real engine), ``plots`` (the chapter's figures and tables) and
``checks`` (argument checks). The engine's own KV backends live in ``course_lib.engine.attention``.
Introduced in 05_attention_kv_cache.ipynb.
"""
