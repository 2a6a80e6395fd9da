"""The course engine: requests, a scheduler step, flat ragged batches, and backends behind small seams.

See ``course_lib/engine/README.md`` for one ``step()`` drawn, and which chapter changes which seam.
"""

from course_lib.engine.engine import Engine, GenerationResult, TokenEvent
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.engine.sequence import Sequence, SequenceStatus

__all__ = [
    "Engine",
    "GenerationResult",
    "SamplingParams",
    "SchedulerConfig",
    "Sequence",
    "SequenceStatus",
    "TokenEvent",
]
