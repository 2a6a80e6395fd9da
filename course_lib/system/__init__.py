"""Chapter 08: the system around the model (Huyen, *AI Engineering*, ch. 10): context from a retriever,
guardrails on the way in and out, a router and gateway in front of two models, cost in money, and caches
across the pipeline. Introduced in 08_system_1_context_guardrails_gateway.ipynb."""
