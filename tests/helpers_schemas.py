"""A seeded generator of bounded JSON schemas (the structured-output tests of every target)."""

from __future__ import annotations

import random


def _leaf(rng: random.Random, depth: int) -> dict:
    kind = rng.choice(
        ["integer", "number", "string", "boolean", "enum", "array", "object"][: 7 if depth else 5]
    )
    if kind == "integer":
        lo = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 5000)}
    if kind == "number":
        lo = rng.randint(-50, 50)
        return {"type": "number", "minimum": lo, "maximum": lo + rng.randint(1, 100)}
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 8)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "cyan", "plain text", "x"], rng.randint(1, 4))}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {
            "type": "array",
            "items": _leaf(rng, depth - 1),
            "minItems": lo,
            "maxItems": lo + rng.randint(0, 3),
        }
    return _object(rng, depth - 1)


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(
        ["id", "name", "count", "tags", "ok", "score", "color", "child", "items", "note"], rng.randint(1, 4)
    )
    props = {n: _leaf(rng, depth) for n in names}
    required = sorted(rng.sample(names, rng.randint(1, len(names))))
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def schemas(n: int = 20, seed: int = 27) -> list[dict]:
    rng = random.Random(seed)
    return [_object(rng, 2) for _ in range(n)]


def assert_schema_answers(client, model: str, max_tokens: int = 400, n: int = 20) -> None:
    """The openai SDK `client` asks the n generated schemas (strict json_schema, sampled, seeded, 4 at a
    time) of `model`: each answer must end by itself (finish_reason stop) and validate against its schema."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import jsonschema

    user = [{"role": "user", "content": "Answer in JSON."}]

    def ask(i_schema):
        i, schema = i_schema
        rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        out = client.chat.completions.create(
            model=model, messages=user, max_tokens=max_tokens, response_format=rf, temperature=1.0, seed=i
        )
        return schema, out.choices[0]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, enumerate(schemas(n))))
    for schema, choice in answers:
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)
