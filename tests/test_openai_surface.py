"""The OpenAI surface applications build on (LPX issue 27, items 3-6), with the official `openai` SDK over
real HTTP to a real gateway in front of a real tritonserver serving the demo's torch engine: n choices
with usage that adds up, a list of prompts, top log probs with the sampled token among them, echo, seeds
that reproduce (also while other requests share the batch), vLLM's load-tool extensions (ignore_eos,
min_tokens, repetition_penalty, top_k) giving the exact output length, OpenAI's max_tokens default,
vLLM's /health, /version, /tokenize, /detokenize, and /v1/responses (create and stream), plus
`lpx bench --api openai` forcing output lengths.

One gateway for the module (`GatewayProcess`, as `lpx serve` starts it) on the session's shared
tritonserver (conftest's `torch_triton`), as tests/test_gateway_strict.py does.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

MODEL = "tiny-llama"
PROMPT = "Bread is made from flour and"
USER = [{"role": "user", "content": "Tell me about bread"}]
# float32 log-softmax of the same row, computed once in the engine: the sampled token's log prob and its
# entry among the alternatives come from the same tensor, so they agree to float32 rounding
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def gateway(torch_triton, tmp_path_factory):
    from helpers_engine import session_gateway

    root = tmp_path_factory.mktemp("surface")
    for proc in session_gateway(torch_triton, root, MODEL):
        yield SimpleNamespace(url=proc.url, access=root / "access.log", log=root / "gateway.log")


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=120) as c:
        yield c


def count(http, text: str) -> int:
    resp = http.post("/tokenize", json={"prompt": text})
    assert resp.status_code == 200, resp.text
    return resp.json()["count"]


def test_n_choices_add_up(client, http) -> None:
    """n = 3: three choices indexed 0..2, each a sample of its own (seed + i), usage the sum of their
    tokens (counted from each choice's log probs) over one prompt."""
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, n=3, max_tokens=12, temperature=1.0, seed=11, logprobs=0
    )
    assert [c.index for c in got.choices] == [0, 1, 2]
    per_choice = [len(c.logprobs.tokens) for c in got.choices]
    assert got.usage.completion_tokens == sum(per_choice) and min(per_choice) >= 1
    assert got.usage.prompt_tokens == count(http, PROMPT)
    assert len({c.text for c in got.choices}) > 1  # independent samples, not one text three times
    # streamed chat: the choices interleave by index, each ends with its finish_reason, usage adds up
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            n=3,
            max_tokens=10,
            temperature=1.0,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    texts, finishes = {}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30


def test_a_list_of_prompts_is_n_choices_each(client, http) -> None:
    prompts = [PROMPT, "The oven"]
    got = client.completions.create(
        model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    assert got.choices[0].text == got.choices[1].text  # greedy: the same prompt gives the same answer
    alone = client.completions.create(model=MODEL, prompt="The oven", max_tokens=6, temperature=0)
    assert got.choices[2].text == alone.choices[0].text
    assert got.usage.prompt_tokens == sum(count(http, p) for p in prompts)
    assert got.usage.completion_tokens == 4 * 6


def test_top_logprobs_hold_the_sampled_token(client) -> None:
    """top_logprobs = 5: five alternatives per token, best first, log probs <= 0; the sampled token is
    among them (top_k 5 samples within the five best) with the same log prob; greedy picks the first."""
    got = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=8,
        temperature=1.0,
        top_logprobs=5,
        logprobs=True,
        seed=3,
        extra_body={"top_k": 5},
    )
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens >= 1
    for tok in content:
        alts = tok.top_logprobs
        assert len(alts) == 5
        values = [a.logprob for a in alts]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        same = [a for a in alts if a.token == tok.token]
        assert same and any(abs(a.logprob - tok.logprob) <= LOGPROB_TOL for a in same), (tok, alts)
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = greedy.choices[0].logprobs
    for token, value, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(alts) <= 3 and token in alts  # (two ids may share a text: then fewer keys)
        assert abs(max(alts.values()) - value) <= LOGPROB_TOL
    assert math.fsum(math.exp(v) for v in lp.token_logprobs) > 0


def test_a_seeded_request_reproduces_in_any_batch(client) -> None:
    """The same seed and parameters five times - concurrently with unseeded requests that change the
    batches they share - give one text; another seed gives another; a negative seed (OpenAI's int64) is
    taken and reproduces too."""

    def seeded(seed: int) -> str:
        return (
            client.completions.create(
                model=MODEL,
                prompt=PROMPT,
                max_tokens=16,
                temperature=1.0,
                seed=seed,
                extra_body={"ignore_eos": True},
            )
            .choices[0]
            .text
        )

    def noise(i: int) -> object:
        return client.completions.create(model=MODEL, prompt=f"{i} loaves", max_tokens=8 + i, temperature=1.0)

    with ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(seeded, 1234) for _ in range(5)] + [pool.submit(noise, i) for i in range(5)]
        texts = {job.result() for job in jobs[:5]}
        for job in jobs[5:]:
            job.result()
    assert len(texts) == 1 and next(iter(texts))
    assert seeded(1235) not in texts  # 16 tokens drawn at temperature 1 from a 512-token vocabulary
    assert seeded(-7) == seeded(-7)


def test_forced_output_lengths_and_defaults(client) -> None:
    """ignore_eos runs to max_tokens exactly; min_tokens holds the end back; max_tokens absent on
    completions is OpenAI's 16; repetition_penalty and top_k are taken."""
    for n in (1, 7, 33):
        got = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
        )
        assert got.usage.completion_tokens == n and got.choices[0].finish_reason == "length"
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"min_tokens": 12}
    )
    assert got.usage.completion_tokens == 12
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True}
    )
    assert got.usage.completion_tokens == 16
    got = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0.7,
        extra_body={"repetition_penalty": 1.3, "top_k": 40},
    )
    assert got.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"min_tokens": 5})
    assert info.value.param == "min_tokens" and "above max_tokens" in info.value.message


def test_echo_and_what_stays_refused(client) -> None:
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert got.choices[0].text == PROMPT + plain.choices[0].text
    refused = [
        (dict(echo=True, logprobs=1), "echo", "prompt's log probabilities"),
        (dict(prompt=[PROMPT] * 50, n=3), "prompt", "at most 128"),
        (dict(best_of=2), "best_of", "best_of"),
        (dict(logit_bias={"5": 1}), "logit_bias", "logit_bias"),
    ]
    for change, param, words in refused:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**{"model": MODEL, "prompt": PROMPT, "max_tokens": 2, **change})
        assert info.value.param == param and words in info.value.message, info.value.message


def test_vllm_routes(http) -> None:
    assert http.get("/health").status_code == 200 and http.get("/health").content == b""
    assert http.get("/version").json()["version"]
    tok = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    assert tok["count"] == len(tok["tokens"]) >= 2 and tok["max_model_len"] == 1024
    back = http.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"]}).json()
    assert back["prompt"].strip() == PROMPT
    chat = http.post("/tokenize", json={"messages": USER, "return_token_strs": True}).json()
    assert chat["count"] > tok["count"] and len(chat["token_strs"]) == chat["count"]
    for path, body, param in (
        ("/detokenize", {"tokens": [10**6]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/tokenize", {"prompt": "x", "messages": USER}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "x", "model": "gpt-4"}, "model"),
    ):
        resp = http.post(path, json=body)
        assert resp.status_code in (400, 404) and resp.json()["error"]["param"] == param, resp.text


def test_responses_create_and_stream(client) -> None:
    got = client.responses.create(
        model=MODEL, input="Tell me about bread", instructions="Be brief", max_output_tokens=8, temperature=0
    )
    assert got.status in ("completed", "incomplete") and got.output_text
    assert got.usage.output_tokens >= 1 and got.usage.input_tokens > 1
    with client.responses.stream(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Tell me about bread"}]}],
        instructions="Be brief",
        max_output_tokens=8,
        temperature=0,
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == got.output_text
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    assert info.value.param == "previous_response_id"


def test_bench_forces_the_output_length(gateway) -> None:
    """`lpx bench --api openai`'s load against the gateway: every request gets exactly the output length
    asked for (ignore_eos + min_tokens), and the notes say it is forced."""
    from pipeline.bench.load import LoadSpec, run_closed
    from pipeline.bench.target import declare, output_notes

    spec = LoadSpec(
        url=gateway.url,
        model=MODEL,
        protocol="openai",
        endpoint="completions",
        output_len=24,
        prompts=(PROMPT,),
    )
    declare(spec)
    notes = output_notes(spec)
    assert spec.force_output and "output length forced" in notes[0], notes
    run = run_closed(spec, concurrency=2, requests=4)
    assert [rec.error for rec in run.records] == [None] * 4
    assert [sum(rec.tokens) for rec in run.records] == [24] * 4


def test_access_log_counts_every_choice_and_no_traceback(gateway) -> None:
    """(last: reads what the tests above wrote) one access-log line per request, with the tokens of all
    its choices; no 500 and no traceback in the gateway's log."""
    lines = [json.loads(line) for line in gateway.access.read_text().splitlines()]
    assert any(rec.get("completion_tokens") == 30 and rec["status"] == 200 for rec in lines)
    assert not [rec for rec in lines if rec["status"] >= 500]
    assert "Traceback" not in gateway.log.read_text()
