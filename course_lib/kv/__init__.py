"""Chapter 05, the KV cache: what it saves and costs, how fewer KV heads shrink it, and what paging saves.

``formulas`` (bytes, requests that fit, FLOPs with and without the cache), ``on_off`` (cache on vs off on
the engine), ``engine_check`` (the formula against the engine's tensors), ``explorer`` (the ipywidgets
calculator), ``heads_timing`` / ``heads_pooling`` / ``uptraining`` (MHA vs GQA vs MQA: decode time, K/V
head pooling, uptraining; command line ``python -m course_lib.kv.cli``), ``paged_memory`` / ``paged_timing``
(fragmentation and sharing, the paged step's cost), ``plots`` (the chapter's figures and tables) and
``checks`` (argument checks). The engine's own KV backends live in ``course_lib.engine.attention``.
Introduced in 05_attention_kv_cache.ipynb.
"""
