"""Chapter 04 (04_decoding.ipynb): choosing each token, and getting more than one per target forward.

``strategies`` measures greedy, beam search and sampling. The rest measure speculative decoding, whose
decoder and proposers are ``course_lib.engine.speculative``: ``verify`` (what a verify forward costs),
``speedup`` (one proposer at one γ against plain greedy, the γ sweep), ``batch_size``, ``domains``
(acceptance by kind of text), ``assisted`` (``transformers``' assisted generation), ``distribution``
(the first-token check in sampling mode), ``explorer`` (the speed-up calculator), ``medusa_train`` and
``medusa_speed`` (Medusa heads), ``convergence`` and ``jacobi_speed`` (Jacobi / lookahead), and
``prompts``, the text they all run on.
"""
