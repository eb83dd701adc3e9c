"""Structured output's cost per token on the torch engine: tok/s of the same requests with and without a
JSON schema (the grammar processor, pipeline/runtime/engines/grammar.py), the demo's engine by default.

    .venv/bin/python scripts/bench_structured.py [--engine-dir DIR] [--requests 8] [--max-tokens 128]

Each round sends `--requests` concurrent requests (temperature 1, a fixed seed per round) and counts
the generated tokens over the wall time; a round is repeated `--rounds` times and the median is printed.
The schema asks for a long answer (an array of up to 40 short strings), so constrained requests run
about as long as unconstrained ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

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


def main() -> None:
    from pipeline.demo import demo_dir
    from pipeline.runtime.engines.torch_engine import TorchEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--engine-dir", type=Path, default=None, help="a torch engine folder (default: the demo's)"
    )
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    found = args.engine_dir or next((f.parent for f in demo_dir().glob("**/lpx_engine.json")), None)
    if found is None:
        raise SystemExit(
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


if __name__ == "__main__":
    main()
