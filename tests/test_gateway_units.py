"""The gateway's parts that need no server: stop sequences, incremental decoding of multi-byte text,
the length rules, API keys and `lpx keys`, and the serving.openai config."""

from __future__ import annotations

import json
import stat

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.gateway.api_keys import KeyRing, add_key, read_keys, revoke_key
from pipeline.gateway.errors import ApiError
from pipeline.gateway.plan import max_tokens_for
from pipeline.gateway.text import StopText
from pipeline.gateway.triton import ModelInfo


def feed_all(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    s = StopText(stops)
    out = [s.feed(p) for p in pieces]
    if not s.stopped:
        out.append(s.flush())
    return out, s.stopped


def test_stop_text_holds_back_what_could_begin_a_stop() -> None:
    out, stopped = feed_all(["END"], ["hello E", "N", "D and more"])
    assert out == ["hello ", "", ""] and stopped
    out, stopped = feed_all(["END"], ["hello E", "N", "O"])  # ENO is not END: the held text goes out
    assert "".join(out) == "hello ENO" and not stopped and out[:2] == ["hello ", ""]
    out, stopped = feed_all(["\n\n", "###"], ["a\n", "\nb"])
    assert out == ["a", ""] and stopped
    out, stopped = feed_all(["ab", "b"], ["xab"])  # the earliest stop in the text wins
    assert out == ["x"] and stopped
    out, _ = feed_all([], ["a", "b"])
    assert "".join(out) == "ab"


def test_detokenizer_never_splits_a_character(tiny_checkpoint) -> None:
    """The demo tokenizer is byte-level: Chinese and emoji span several tokens; no streamed piece may end
    inside a character, and the pieces add up to the whole decode."""
    from pipeline.gateway.text import TextCodec

    codec = TextCodec(tiny_checkpoint)
    text = "Bread 面包 is 😀🍞 made, ünïcödé."
    ids = codec.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text.split()), "multi-byte characters span tokens here"
    detok = codec.detokenizer()
    pieces = [detok.feed([t]) for t in ids]
    pieces.append(detok.finish())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p == "") > 0, "some tokens completed no character on their own"
    # ids that end inside a character: the held bytes come out at the end, as decode shows them
    cut = next(i for i in range(1, len(ids)) if codec.decode(ids[:i]).endswith("\ufffd"))
    detok = codec.detokenizer()
    streamed = "".join(detok.feed([t]) for t in ids[:cut]) + detok.finish()
    assert streamed == codec.decode(ids[:cut])


def test_chat_template_of_the_demo_tokenizer(tiny_checkpoint) -> None:
    from pipeline.gateway.text import TextCodec

    codec = TextCodec(tiny_checkpoint)
    ids = codec.encode_chat([{"role": "user", "content": "Hi"}])
    assert codec.tokenizer.decode(ids) == "<|begin_of_text|>user: Hi\nassistant:"


def test_lengths_follow_the_engine() -> None:
    info = ModelInfo(inputs={}, outputs=set(), max_input_len=512, max_seq_len=1024, max_tokens_cap=512)
    assert max_tokens_for(None, 100, info, "max_tokens") == 512  # capped
    assert max_tokens_for(None, 600, ModelInfo({}, set(), 0, 1024, 512), "max_tokens") == 424  # what remains
    assert max_tokens_for(10, 100, info, "max_tokens") == 10
    assert max_tokens_for(None, 5, ModelInfo({}, set()), "max_tokens") == 16  # nothing known
    with pytest.raises(ApiError, match="max_input_len 512"):
        max_tokens_for(None, 600, info, "max_tokens")
    with pytest.raises(ApiError, match="limit of 512"):
        max_tokens_for(513, 10, info, "max_tokens")
    wide = ModelInfo({}, set(), 512, 1024, 900)
    with pytest.raises(
        ApiError, match=r"\(500 tokens\) \+ max_completion_tokens \(600\) = 1100 .* at most 524"
    ):
        max_tokens_for(600, 500, wide, "max_completion_tokens")


@pytest.mark.parametrize(
    ("n_prompt", "max_tokens", "min_tokens", "param", "code"),
    [
        (10, 513, 0, "max_tokens", None),  # above serving.max_tokens_cap
        (1000, 100, 0, "max_tokens", "context_length_exceeded"),  # prompt + max_tokens above max_seq_len
        (10, 4, 5, "min_tokens", None),  # min_tokens above max_tokens
    ],
)
def test_a_limit_refuses_with_one_message_at_the_gateway_and_at_the_models(
    n_prompt: int, max_tokens: int, min_tokens: int, param: str, code: str | None
) -> None:
    """Each length limit has one check and one message (pipeline/runtime/limits.py): the gateway's 400 and
    the models' refusal of the same numbers (validate.check: what a direct Triton client gets) agree."""
    from pipeline.gateway.plan import plan_one
    from pipeline.gateway.schemas import CompletionRequest
    from pipeline.runtime.validate import Limits, RequestError, check

    info = ModelInfo({"min_tokens": "INT32"}, set(), 0, 1024, 512)
    engine = Limits(max_seq_len=1024, max_tokens_cap=512, supported=frozenset({"min_tokens"}))
    body = {"model": "m", "prompt": "hi", "max_tokens": max_tokens, "min_tokens": min_tokens or None}
    with pytest.raises(ApiError) as gateway:
        plan_one(CompletionRequest.model_validate(body), [1] * n_prompt, None, info)
    with pytest.raises(RequestError) as models:
        check({"max_tokens": max_tokens, "min_tokens": min_tokens}, engine, n_prompt=n_prompt)
    assert gateway.value.message == str(models.value)
    assert (gateway.value.status, gateway.value.param, gateway.value.code) == (400, param, code)


def test_a_long_prompt_is_refused_before_its_max_tokens() -> None:
    """max_input_len first (param: the prompt, or a chat's messages when it sent max_completion_tokens),
    then a prompt that leaves no room below max_seq_len; both context_length_exceeded."""
    info = ModelInfo({}, set(), 512, 1024, 512)
    for sent, where in (("max_tokens", "prompt"), ("max_completion_tokens", "messages")):
        with pytest.raises(ApiError, match="600 tokens, above the engine's max_input_len 512") as err:
            max_tokens_for(10_000, 600, info, sent)
        assert (err.value.param, err.value.code) == (where, "context_length_exceeded")
    with pytest.raises(ApiError, match="leaving no room below the engine's max_seq_len 1024") as err:
        max_tokens_for(None, 1024, ModelInfo({}, set(), 0, 1024, 512), "max_completion_tokens")
    assert (err.value.param, err.value.code) == ("prompt", "context_length_exceeded")


def _chat(**fields):
    from pipeline.gateway.schemas import ChatCompletionRequest

    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]} | fields
    )


def test_choices_seeds_and_alternatives_are_planned_per_engine() -> None:
    """Alternatives go to an engine that declares LPX's top-k tensors and are refused naming the engine
    target's C++ backend otherwise; a negative seed is sent modulo 2**64; ignore_eos is min_tokens =
    max_tokens; completions default to 16 tokens within the room left."""
    from pipeline.gateway.plan import plan_one
    from pipeline.gateway.triton import TOP_INPUT, TOP_OUTPUTS

    logprobs = ({"return_log_probs": "BOOL"}, {"output_log_probs"})
    cxx = ModelInfo(
        inputs=dict(logprobs[0]), outputs=set(logprobs[1]), max_seq_len=1024, backend="tensorrtllm"
    )
    with pytest.raises(ApiError, match=r"C\+\+ backend\) returns only the sampled token") as info:
        plan_one(_chat(logprobs=True, top_logprobs=3), [1, 2], None, cxx)
    assert info.value.param == "top_logprobs"
    torch_like = ModelInfo(
        inputs={
            **logprobs[0],
            TOP_INPUT: "INT32",
            "seed": "UINT64",
            "min_tokens": "INT32",
            "temperature": "FP32",
        },
        outputs={*logprobs[1], *TOP_OUTPUTS},
        max_seq_len=1024,
        backend="python",
    )
    job = plan_one(
        _chat(logprobs=True, top_logprobs=3, seed=-1, ignore_eos=True, temperature=1.0, max_tokens=7),
        [1, 2],
        None,
        torch_like,
    )
    inputs = job.inputs()
    assert inputs[TOP_INPUT] == 3 and inputs["seed"] == 2**64 - 1 and inputs["min_tokens"] == 7
    assert inputs["request_output_len"] == job.max_tokens == 7 and job.route == "chat"
    assert plan_one(_chat(), [1] * 1015, None, torch_like, 16).max_tokens == 9
    assert plan_one(_chat(), [1, 2], None, torch_like, 16).max_tokens == 16
    with pytest.raises(ApiError, match="not taken by the served model") as info:
        plan_one(_chat(ignore_eos=True, max_tokens=4), [1, 2], None, cxx)
    assert info.value.param == "ignore_eos"


def test_a_seeded_draw_depends_on_seed_step_and_row_only() -> None:
    """torch_sampling.draw: the same (row, seed, step) gives the same token; only finite scores are
    drawn; over 1500 steps the draws follow the row's probabilities (fixed seeds, so deterministic: the
    bound, 5 points of frequency, is about 4 standard deviations of a binomial at n = 1500)."""
    torch = pytest.importorskip("torch")
    from pipeline.runtime.engines.torch_sampling import draw

    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    scores = torch.full((16,), float("-inf"))
    scores[[3, 5, 8, 13]] = probs.log()
    tokens = [draw(scores, 42, step) for step in range(1500)]
    assert tokens[:50] == [draw(scores.clone(), 42, step) for step in range(50)]
    assert tokens[:50] != [draw(scores, 43, step) for step in range(50)]
    assert set(tokens) <= {3, 5, 8, 13}
    for token, p in zip((3, 5, 8, 13), probs.tolist(), strict=True):
        assert abs(tokens.count(token) / len(tokens) - p) < 0.05


def test_keys_are_hashed_private_and_revocable(tmp_path) -> None:
    path = tmp_path / "gw" / "keys.json"
    key, secret = add_key(path, "alice", requests_per_minute=5)
    assert secret.startswith("lpx-") and len(secret) > 40
    raw = path.read_text()
    assert secret not in raw and key.sha256 in raw
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(path.parent.glob(".keys-*")), "no temporary file left"
    ring = KeyRing(path)
    assert ring.required and ring.find(secret).id == key.id and ring.find(secret + "x") is None
    other, _ = add_key(path, "bob")
    assert [k.id for k in read_keys(path)] == [key.id, other.id]
    revoke_key(path, key.id)
    ring.reload()
    assert ring.find(secret) is None and [k.id for k in read_keys(path)] == [other.id]


def test_lpx_keys_commands(tmp_path) -> None:
    path = tmp_path / "keys.json"
    runner = CliRunner()
    res = runner.invoke(cli, ["keys", "add", "--name", "ci", "--rpm", "60", "--file", str(path)])
    assert res.exit_code == 0, res.output
    secret = res.stdout.strip().splitlines()[0]
    assert secret.startswith("lpx-") and "only time" in res.stderr
    listed = runner.invoke(cli, ["keys", "list", "--json", "--file", str(path)])
    entries = json.loads(listed.stdout)
    assert entries[0]["name"] == "ci" and entries[0]["requests_per_minute"] == 60
    assert secret not in listed.output and "sha256" not in listed.output
    res = runner.invoke(cli, ["keys", "revoke", entries[0]["id"], "--file", str(path)])
    assert res.exit_code == 0 and "revoked" in res.output
    res = runner.invoke(cli, ["keys", "revoke", "key-nope", "--file", str(path)])
    assert res.exit_code != 0 and "No key 'key-nope'" in str(res.exception)
    path.write_text("{not json")
    res = runner.invoke(cli, ["keys", "list", "--file", str(path)])
    assert isinstance(res.exception, Exception) and "not a valid keys file" in str(res.exception)


def test_serving_openai_config(tmp_path) -> None:
    from pipeline.config import parse_config
    from pipeline.demo import demo_config_dict
    from pipeline.errors import ConfigError
    from pipeline.gateway.settings import from_config

    data = demo_config_dict(str(tmp_path / "ckpt"))
    cfg = parse_config(data, base=tmp_path)
    assert cfg.serving.openai.enabled and cfg.serving.openai.port == 9000
    s = from_config(cfg, "127.0.0.1:8001", tmp_path / "tok")
    assert s.host == "127.0.0.1" and s.model_name == cfg.model.name
    # the engine's limits reach the gateway by one road, the served repository's parameters (ModelInfo)
    assert not {"max_tokens_cap", "max_seq_len", "max_input_len"} & set(type(s).model_fields)
    data["serving"]["openai"] = {
        "port": 70000,
        "api_keys_file": "keys.json",
        "rate_limit_storage": "redis://h:6379",
    }
    with pytest.raises(ConfigError, match="serving.openai.port"):
        parse_config(data, base=tmp_path)
    data["serving"]["openai"]["port"] = 0
    cfg = parse_config(data, base=tmp_path)
    assert cfg.serving.openai.api_keys_file == tmp_path / "keys.json"
    data["serving"]["openai"]["tokens"] = 5
    with pytest.raises(ConfigError, match="serving.openai.tokens: unknown key"):
        parse_config(data, base=tmp_path)
