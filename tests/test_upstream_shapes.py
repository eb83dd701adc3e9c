"""Every output of LPX's ensemble and BLS model has upstream's shape: in config.pbtxt (name, type, dims,
batching) per contract version LPX targets, and on the wire, read the way upstream's own client reads it
(`result.as_numpy("text_output")[0].decode()`, `batch_index[0][0]`...). The facts are data:
tests/contracts/tensorrtllm_backend_models.json, `versions` (config) and `response_shapes` (responses)."""

from __future__ import annotations

import json
import queue
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.facts import trtllm
from pipeline.runtime.tensors import DEFAULT_DTYPES
from pipeline.stages.repository.model_configs import model_config

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = json.loads((ROOT / "tests/contracts/tensorrtllm_backend_models.json").read_text())
SHAPES = CONTRACT["response_shapes"]
MODELS = ("ensemble", "tensorrt_llm_bls")
# LPX's outputs beyond upstream's at a version: its BLS counts tokens itself, also over v0.16 engines
EXTRAS = {("tensorrt_llm_bls", "v0.16.0"): {"num_output_tokens"}}
BEAMS = 1  # LPX builds and serves beam width 1


def upstream_outputs(version: str, model: str) -> dict[str, tuple[str, list[int]]]:
    """Upstream's config outputs at one version, `${logits_datatype}` filled as LPX fills it."""
    fill = {"${" + k + "}": v for k, v in DEFAULT_DTYPES.items()}
    rows = CONTRACT["versions"][version]["models"][model]["outputs"]
    return {t["name"]: (fill.get(t["data_type"], t["data_type"]), t["dims"]) for t in rows}


def declared(conf: mc.ModelConfig) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in conf.output}


def check_config(conf: mc.ModelConfig, version: str) -> None:
    """conf's outputs are upstream's at `version` (plus LPX's listed extras, with latest's type and dims),
    batched as upstream's (max_batch_size > 0), and each has a response shape in the contract."""
    model = conf.name
    theirs = upstream_outputs(version, model)
    ours = declared(conf)
    extras = EXTRAS.get((model, version), set())
    assert set(ours) == set(theirs) | extras, f"{model} at {version}: {set(ours) ^ (set(theirs) | extras)}"
    assert {n: ours[n] for n in theirs} == theirs, f"{model} at {version}: outputs differ from upstream's"
    latest = upstream_outputs("latest", model)
    assert {n: ours[n] for n in extras} == {n: latest[n] for n in extras}
    assert conf.max_batch_size > 0, "upstream's max_batch_size is ${triton_max_batch_size}: batching on"
    for name, (_, dims) in ours.items():
        shape = SHAPES["versions"]["latest" if name in extras else version]["outputs"][name]["shape"]
        # text_output is [batch * beams] on the wire; every other output is [1] + its config dims' rank
        assert len(shape) == (1 if name == "text_output" else 1 + len(dims)), (name, shape, dims)


def test_written_repository_declares_upstreams_outputs(torch_triton) -> None:
    """The configs of the repository the session's server runs (torch target: the latest contract)."""
    for model in MODELS:
        text = (Path(torch_triton.repo) / model / "config.pbtxt").read_text()
        check_config(text_format.Parse(text, mc.ModelConfig()), "latest")


@pytest.mark.parametrize("line", trtllm.ENGINE_LINES)  # the engine target exists on these lines only
def test_engine_target_declares_each_lines_outputs(line: str) -> None:
    """The engine target speaks its TensorRT-LLM line's contract (v0.16's outputs differ from latest's)."""
    data = demo_config_dict("checkpoint")
    data["build"].update(target="engine", trtllm_version=line)
    cfg = parse_config(data)
    for model in MODELS:
        conf = text_format.Parse(text_format.MessageToString(model_config(model, cfg)), mc.ModelConfig())
        check_config(conf, trtllm.contract_version(line))


def fits(shape: tuple[int, ...], pattern: list, bound: dict[str, int]) -> bool:
    """shape matches the contract's pattern: ints equal, each symbol one size (beams = BEAMS)."""
    if len(shape) != len(pattern):
        return False
    for size, want in zip(shape, pattern, strict=True):
        if isinstance(want, int):
            if size != want:
                return False
        elif bound.setdefault(want, size) != size:
            return False
    return True


def tensor(name: str, arr: np.ndarray):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


ASKED = ("text_output", "cum_log_probs", "output_log_probs", "num_input_tokens", "num_output_tokens")


def upstream_client_call(url: str, model: str, stream: bool) -> list:
    """What upstream's end_to_end_grpc_client does: one stream per prompt, [[value]] inputs, stop_stream
    to wait for the end, then the responses from the callback's queue."""
    import tritonclient.grpc as grpcclient

    arrays = {
        "text_input": np.array([["Bread is made"]]).astype(object),
        "max_tokens": np.array([[6]], dtype=np.int32),
        "stream": np.array([[stream]], dtype=bool),
        "beam_width": np.array([[BEAMS]], dtype=np.int32),
        "top_k": np.array([[1]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
        "return_log_probs": np.array([[True]], dtype=bool),
        "return_num_input_tokens": np.array([[True]], dtype=bool),
        "return_num_output_tokens": np.array([[True]], dtype=bool),
    }
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), got))
        client.async_stream_infer(
            model,
            [tensor(name, arr) for name, arr in arrays.items()],
            outputs=[grpcclient.InferRequestedOutput(name) for name in ASKED],
        )
        client.stop_stream()  # waits until the server closes the stream
    finally:
        client.close()
    results = []
    while not got.empty():
        results.append(got.get())
    return results


def test_responses_read_as_upstreams_client_reads_them(torch_triton) -> None:
    """Ensemble and BLS, streamed and not: text_output[0].decode() works, every output's shape is the
    contract's, [1, 1] outputs read as [0][0], and the streamed deltas join to the one-shot text."""
    from tritonclient.utils import InferenceServerException

    shapes = SHAPES["versions"]["latest"]["outputs"]
    texts = {}
    for model in MODELS:
        for stream in (True, False):
            results = upstream_client_call(torch_triton.grpc_url, model, stream)
            errors = [r for r in results if isinstance(r, InferenceServerException)]
            assert results and not errors, (model, stream, errors)
            assert stream or len(results) == 1, "stream=false: one response"
            text = ""
            for result in results:
                bound = {"beams": BEAMS}
                for name in ASKED:
                    arr = result.as_numpy(name)
                    if arr is None and name == "num_input_tokens":
                        continue  # LPX sends it on the last response only (upstream's C++ model on every one)
                    assert arr is not None, f"{model} stream={stream}: no {name}"
                    pattern = shapes[name]["shape"]
                    assert fits(arr.shape, pattern, bound), (model, stream, name, arr.shape, pattern)
                    if pattern == [1, 1]:
                        assert int(arr[0][0]) >= 0
                text += result.as_numpy("text_output")[0].decode("utf-8")
                assert bound["tokens"] == int(result.as_numpy("num_output_tokens")[0][0]) > 0
            texts[model, stream] = text
    assert texts[MODELS[0], False], "the answer is not empty"
    assert len(set(texts.values())) == 1, texts
