"""`lpx bench` for text models: prompts of exactly --input-len tokens with the served model's tokenizer,
min_tokens forcing (and its fallback when refused), measured ISL/OSL in the report; against real
tritonservers (the demo repository, and a text stand-in declaring min_tokens / num_input_tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.bench import prompts
from pipeline.bench.prompts import PromptMaker, find_tokenizer
from pipeline.cli.tools import bench as bench_command
from pipeline.errors import UsageError


@pytest.mark.parametrize("n", [2, 32, 128, 500])
def test_prompts_have_exactly_the_asked_token_count(tiny_checkpoint, n):
    maker = PromptMaker.load(tiny_checkpoint)  # adds BOS, as LPX's preprocessing does
    rng = np.random.default_rng(n)
    texts = [maker.make(n, rng) for _ in range(5)]
    assert len(set(texts)) == 5, "each request gets its own prompt (no accidental prefix reuse)"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)  # counted independently of PromptMaker
    assert all(len(tok.encode(t)) == n for t in texts)


def test_too_short_a_prompt_names_the_fix(tiny_checkpoint):
    with pytest.raises(UsageError, match="--input-len 2 or more"):
        PromptMaker.load(tiny_checkpoint).make(1, np.random.default_rng(0))


def test_tokenizer_found_from_the_repository_or_given(tmp_path, tiny_checkpoint):
    with pytest.raises(UsageError, match="--tokenizer .*no tokenizer files"):
        find_tokenizer("127.0.0.1:1", tmp_path)
    assert find_tokenizer("10.1.2.3:8001", tiny_checkpoint) == tiny_checkpoint
    assert find_tokenizer("10.1.2.3:8001", None) is None  # remote, nothing given: caller notes it
    tok = tmp_path / "repo" / "preprocessing" / "1" / "tokenizer"
    tok.mkdir(parents=True)
    (tok / "tokenizer.json").write_text("{}")
    assert find_tokenizer("10.1.2.3:8001", None, tmp_path / "repo") == tok


# -- a text model standing in for the ensemble, with min_tokens and num_input_tokens -----------------
TEXT_CONFIG = """
name: "ensemble"
backend: "python"
max_batch_size: 1
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "min_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "honour_min_tokens" value: {{ string_value: "{honour}" }} }}
parameters {{ key: "tokenizer" value: {{ string_value: "{tokenizer}" }} }}
"""

TEXT_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def value(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    """Stops at end-of-sequence after max_tokens // 2 tokens unless min_tokens holds it to max_tokens;
    refuses min_tokens when honour_min_tokens is false, as a server without min_tokens does."""

    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.honour = params["honour_min_tokens"]["string_value"] == "true"
        self.tok = AutoTokenizer.from_pretrained(params["tokenizer"]["string_value"])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = value(request, "text_input").decode()
            n_max = int(value(request, "max_tokens"))
            n_min = value(request, "min_tokens")
            if n_min is not None and int(n_min) != 0 and not self.honour:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "min_tokens is not supported by this model - leave it out",
                    pb_utils.TritonError.INVALID_ARG)), flags=FINAL)
                continue
            n = max(n_max // 2, int(n_min or 0))
            outs = [pb_utils.Tensor("text_output", np.array([[b"x"]], dtype=object)),
                    pb_utils.Tensor("num_output_tokens", np.array([[1]], dtype=np.int32))]
            if value(request, "return_num_input_tokens"):
                outs.append(pb_utils.Tensor("num_input_tokens",
                                            np.array([[len(self.tok.encode(text))]], dtype=np.int32)))
            for k in range(n):
                sender.send(pb_utils.InferenceResponse(outs), flags=FINAL if k + 1 == n else 0)
        return None
'''


def write_text_repo(root: Path, tokenizer: Path, honour: bool) -> Path:
    model = root / "ensemble"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(TEXT_CONFIG.format(honour=str(honour).lower(), tokenizer=tokenizer))
    (model / "1" / "model.py").write_text(TEXT_MODEL)
    return root


def bench_args(url: str, out: Path, *extra: str) -> list[str]:
    return ["--url", url, "--concurrency", "2", "--requests", "6", "--warmup", "1", "--out", str(out), *extra]


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("honour", [True, False])
def test_min_tokens_forced_or_refused_once_and_counts_from_the_server(tmp_path, tiny_checkpoint, honour):
    from pipeline.servers.tritonserver import TritonServer

    repo = write_text_repo(tmp_path / "repo", tiny_checkpoint, honour)
    with TritonServer(repo, ready_timeout_s=90) as srv:
        res = CliRunner().invoke(
            bench_command,
            bench_args(
                srv.grpc_url,
                tmp_path / "out",
                "--tokenizer",
                str(tiny_checkpoint),
                "--input-len",
                "40",
                "--output-len",
                "10",
            ),
        )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    (level,) = doc["results"]
    assert level["failed"] == 0 and level["isl_counted_by"] == ["num_input_tokens"]
    assert level["isl"]["min"] == level["isl"]["max"] == 40 == level["isl_requested"]["mean"]
    assert doc["target"]["output_forced"] is honour
    if honour:
        assert level["osl"]["min"] == level["osl"]["max"] == 10
    else:  # refused once, then not sent: every counted request succeeds, stopping early
        assert level["osl"]["max"] == 5
        assert any("refused min_tokens=10" in n for n in doc["notes"]), doc["notes"]
    assert "| ISL requested | ISL measured |" in (tmp_path / "out" / "results.md").read_text()


# -- the demo, served from its real repository --------------------------------------------------------
@pytest.fixture(scope="module")
def demo_server(tmp_path_factory, tiny_checkpoint):
    """The demo's repository (stages run once) served by a real tritonserver on 127.0.0.1."""
    import os

    import yaml

    from pipeline.config import resolve_config
    from pipeline.demo import demo_config_dict
    from pipeline.progress import Reporter
    from pipeline.runner import Runner
    from pipeline.servers.selection import choose
    from pipeline.servers.tritonserver import TritonServer

    root = tmp_path_factory.mktemp("demo")
    old = os.environ.get("LPX_HOME")
    os.environ["LPX_HOME"] = str(root / "home")
    try:
        path = root / "lpx.yaml"
        path.write_text(yaml.safe_dump(demo_config_dict(str(tiny_checkpoint)), sort_keys=False))
        cfg = resolve_config(path, Reporter())
        runner = Runner(cfg, Reporter())
        outcome = runner.run(cfg.select(None), "repo")[0]
        _, repo = choose(outcome)
        with TritonServer(repo.path, ready_timeout_s=180) as srv:
            yield srv, repo.path
    finally:
        if old is None:
            os.environ.pop("LPX_HOME", None)
        else:
            os.environ["LPX_HOME"] = old


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize(
    ("protocol", "isl", "osl"), [("grpc", 128, 128), ("http", 32, 16), ("grpc", 500, 16)]
)
def test_demo_measured_isl_equals_requested(demo_server, tmp_path, protocol, isl, osl):
    """`lpx bench --url H:P --model ensemble`: the tokenizer found from the served repository."""
    srv, repo = demo_server
    url = srv.grpc_url if protocol == "grpc" else srv.http_url
    res = CliRunner().invoke(
        bench_command,
        bench_args(url, tmp_path / "out", "--model", "ensemble", "--protocol", protocol)
        + ["--input-len", str(isl), "--output-len", str(osl)],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["target"]["prompts"]["tokenizer"] == str(repo / "preprocessing" / "1" / "tokenizer")
    (level,) = doc["results"]
    assert level["failed"] == 0, level["errors"]
    assert level["isl"]["min"] == level["isl"]["max"] == isl == level["isl_requested"]["mean"]
    assert level["osl_requested"]["mean"] == osl and 1 <= level["osl"]["max"] <= osl
    print(f"ISL requested {isl}: measured {level['isl']} by {level['isl_counted_by']}; OSL {level['osl']}")


@pytest.mark.triton
@pytest.mark.slow
def test_demo_without_a_tokenizer_says_how_to_pass_one(demo_server, tmp_path, monkeypatch):
    srv, _ = demo_server
    monkeypatch.setattr(prompts, "served_repo", lambda url: None)  # as if the server were remote
    res = CliRunner().invoke(bench_command, bench_args(srv.grpc_url, tmp_path / "out", "--input-len", "64"))
    assert res.exit_code == 0, res.output
    assert "pass --tokenizer DIR" in res.output and "preprocessing/1/tokenizer" in res.output
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["target"]["prompts"]["kind"] == "approximate (no tokenizer)"
    (level,) = doc["results"]
    assert level["failed"] == 0
