"""The prompts chapter 04 measures speculative decoding on: grounded (the answer copies the prompt) and free.

"grounded": continue or edit code that is in the context, the case prompt lookup is made for; "free":
nothing to copy from. Plain data, shared by the notebook, ``benchmarks/speculative.py`` and the
exercises so that every speed-up is measured on the same text. Introduced in 04_decoding.ipynb.
"""

GROUNDED_PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n\n\n"
    "class Size:\n    def __init__(self, width, height):",
    "import os\nimport sys\n\n\ndef read_file(path):\n    with open(path) as f:\n        return f.read()\n\n\n"
    "def write_file(path, text):",
]
FREE_PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import json\n\n\ndef load(path):"]
