"""scripts/bench_structured.py's measurement: structured output's cost per token on the torch engine, tok/s of
the same concurrent requests with and without a JSON schema (the grammar processor,
pipeline/runtime/engines/grammar.py), the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from ..errors import NotFound

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {"type": "string", "maxLength": 6},
            "minItems": 30,
            "maxItems": 40,
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}


def round_(engine, prompt: list[int], n: int, max_tokens: int, guided: bool) -> tuple[int, float]:
    extra = (
        {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(SCHEMA)}
        if guided
        else {}
    )
    counts = [0] * n

    def one(i: int) -> None:
        counts[i] = len(engine.generate(prompt, max_tokens, temperature=1.0, top_k=0, top_p=1.0, **extra))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    from ..demo import demo_dir
    from ..runtime.engines.torch_engine import TorchEngine

    found = args.engine_dir or next((f.parent for f in demo_dir().glob("**/lpx_engine.json")), None)
    if found is None:
        raise NotFound(
            f"no torch engine under {demo_dir()} - run 'make demo' first, or pass --engine-dir with a torch "
            "build folder (one holding lpx_engine.json)"
        )
    engine_dir = found
    with TorchEngine(engine_dir) as engine:
        prompt = [5, 6, 7, 8]
        round_(engine, prompt, 2, 8, True)  # warm-up: the compiler and the first grammar
        for guided in (False, True):
            rates = []
            for _ in range(args.rounds):
                tokens, secs = round_(engine, prompt, args.requests, args.max_tokens, guided)
                rates.append(tokens / secs)
            label = "json_schema" if guided else "no schema"
            print(
                f"{label:12s} {statistics.median(rates):8.1f} tok/s (median of {args.rounds}; {args.requests} concurrent)"
            )
    return 0
