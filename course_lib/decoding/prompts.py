"""The prompts chapter 04 measures speculative decoding on: grounded (the answer copies the prompt) and free,
as plain code for the tiny models and as chat turns for SmolLM2-135M-Instruct.

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

_CODE = """def read_config(path):
    with open(path) as f:
        lines = f.readlines()
    result = {}
    for line in lines:
        if "=" in line:
            key, value = line.split("=", 1)
            result[key.strip()] = value.strip()
    return result
"""
_LOG = (
    "2024-05-01 10:00:01 INFO server started on port 8080\n"
    "2024-05-01 10:00:07 ERROR database connection refused (host=db1, retry=1)\n"
    "2024-05-01 10:00:09 INFO request GET /health 200\n"
    "2024-05-01 10:00:12 ERROR database connection refused (host=db1, retry=2)\n"
    "2024-05-01 10:00:15 WARNING slow request GET /items 2.3 s\n"
    "2024-05-01 10:00:20 ERROR disk usage above 90% on /var/lib/data\n"
)

#: Input-grounded chat tasks for SmolLM2-135M-Instruct (user turns; the chat template is applied by
#: ``chat_ids``): the answer repeats most of its input, as an edit, a refactor or an extraction does.
CHAT_GROUNDED = [
    f"Copy the lines of this log that contain ERROR, unchanged, one per line.\n\n```\n{_LOG}```",
    f"Add a docstring to this function. Reply with the whole function and nothing else.\n\n```python\n{_CODE}```",
    "Add type hints to this function. Reply with the whole function only.\n\n"
    "```python\ndef scale(values, factor):\n    out = []\n    for v in values:\n        out.append(v * factor)\n"
    "    return out\n```",
]
#: Chat tasks with nothing to copy: what a draft model has to guess on its own.
CHAT_FREE = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences what a hash table is.",
]


def chat_ids(tokenizer, user_text: str) -> list[int]:
    """Token ids of one user turn in the model's chat template, ending where the assistant's answer starts."""
    if not isinstance(user_text, str) or not user_text:
        raise ValueError(f"user_text must be a non-empty string, got {user_text!r}")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": user_text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
