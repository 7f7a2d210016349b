"""What the topics benchmark's worker processes run: a no-op task per group of the topic
`bench.topic`, each group in a queue of its own (see tests/benchmarks/topics.py).

    python -m txtasks worker tests.benchmarks.topics_apps:app --queue t0 --queue t1 ...
"""

from __future__ import annotations

from typing import Any

from txtasks import App

TOPIC = "bench.topic"
GROUPS = 10

app = App("topics-bench")


def _noop(payload: Any) -> None:
    return None


tasks = [
    app.task(name=f"bench.g{n}", queue=f"t{n}", subscribe=TOPIC, group=f"g{n}")(_noop)
    for n in range(GROUPS)
]
