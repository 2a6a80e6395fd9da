"""Chapter 03, compression: fewer bytes per weight (quantization), fewer weights (pruning), a smaller
model that imitates a larger one (distillation). Each is measured on the course's engine: bytes, decode
speed and quality. Introduced in 03_compression.ipynb."""
