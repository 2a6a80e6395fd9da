"""The serving engine: sampling, batching, scheduling and the decode loop."""
