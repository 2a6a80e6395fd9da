"""Energy per generated token: a short greedy decode on the course engine between two energy readings.

``decode_energy`` warms the engine up with one generation, then measures a second one of ``new_tokens``
tokens with ``course_lib.measure.energy.measure_energy`` (NVML on a GPU, RAPL on a CPU), beside the idle
draw over as long a pause. It reports joules per token gross (what the meter saw: the whole board or
the whole socket, idle power included) and above idle (what decoding added). Where no counter is
readable, the caller prints the counter's reason instead of running anything. Introduced in
00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.engine.generation import generate
from course_lib.engine.sampling import SamplingParams
from course_lib.measure.costs import check_positive_int
from course_lib.measure.energy import EnergyCounter, EnergyReading, measure_energy

PROMPT = "The three ceilings of a chip are"


@dataclass(frozen=True)
class TokenEnergy:
    reading: EnergyReading
    tokens: int

    @property
    def joules_per_token(self) -> float:
        return self.reading.joules / self.tokens

    @property
    def above_idle_per_token(self) -> float:
        return self.reading.above_idle_j / self.tokens

    def __str__(self) -> str:
        r = self.reading
        return (
            f"{self.tokens} tokens in {r.seconds:.2f} s on {r.source}: {r.joules:.2f} J = "
            f"{self.joules_per_token * 1e3:.1f} mJ/token at {r.watts:.1f} W; idle draw {r.idle_watts:.1f} W, so "
            f"{self.above_idle_per_token * 1e3:.1f} mJ/token above idle"
        )


def decode_energy(engine, counter: EnergyCounter, new_tokens: int = 64) -> TokenEnergy:
    """Joules per token of one greedy decode of ``new_tokens`` tokens (EOS ignored) on ``engine``."""
    check_positive_int("new_tokens", new_tokens)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    cuda = torch.cuda.is_available() and str(getattr(engine, "device", "cpu")).startswith("cuda")
    out = []

    def run() -> None:
        out[:] = generate(engine, [PROMPT], params)
        if cuda:
            torch.cuda.synchronize()

    run()  # warm-up: first calls pay for allocation and kernel selection
    reading = measure_energy(counter, run)
    return TokenEnergy(reading, len(out[0].output_ids))
