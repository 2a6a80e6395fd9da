"""Speculative decoding: a cheap proposer guesses γ tokens, the target verifies them all in ONE forward.

``verifier`` (the decoder: one forward over γ+1 tokens per row, rollback), ``acceptance`` (the greedy
rule and the rejection rule with its residual and bonus token), ``proposer`` (the seam every guesser
plugs into), ``draft`` and ``prompt_lookup`` (the proposers), ``layer_draft`` (a draft made of the
target's own layers with a truncated-vocabulary head), ``medusa`` / ``medusa_tree`` and
``jacobi`` (the draft-free ones), ``stats`` (what a run counted) and ``theory`` (E(α, γ), the speed-up,
the best γ). Their measurements live in ``course_lib.decoding``. Introduced in 04_decoding.ipynb.
"""

from course_lib.engine.speculative.draft import DraftProposer
from course_lib.engine.speculative.layer_draft import TruncatedHead, load_layer_draft
from course_lib.engine.speculative.prompt_lookup import PromptLookupProposer
from course_lib.engine.speculative.proposer import Proposal, Proposer, Verified
from course_lib.engine.speculative.stats import SpecStats, SpeculativeOutput, SpeculativeResult
from course_lib.engine.speculative.theory import best_gamma, expected_speedup, expected_tokens
from course_lib.engine.speculative.verifier import SpeculativeDecoder

__all__ = [
    "DraftProposer",
    "PromptLookupProposer",
    "Proposal",
    "Proposer",
    "SpecStats",
    "SpeculativeDecoder",
    "SpeculativeOutput",
    "SpeculativeResult",
    "TruncatedHead",
    "Verified",
    "best_gamma",
    "expected_speedup",
    "expected_tokens",
    "load_layer_draft",
]
