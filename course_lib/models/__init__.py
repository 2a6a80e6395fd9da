"""The course's language models: corpus, tokenizer, training, loading and accounting."""
