import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")
# ruff: noqa: E402 - the stub starts in the C locale: set UTF-8 before any heavy import (docs/architecture.md)

"""LPX's BLS model `tensorrt_llm_bls` (decoupled): the ensemble's request tensors in, text_output out,
with the pipeline run here instead of by Triton's ensemble scheduler.

Per request (each on its own thread, so requests progress together): preprocessing (one call),
then tensorrt_llm with `exec(decoupled=True)`, then postprocessing on every token delta the engine
streams. stream=true: one response per delta as it comes, then an empty FINAL response.
stream=false: exactly one response, FINAL, with the whole text (HTTP `generate` needs exactly one).
text_output is postprocessing's OUTPUT as it comes, [beams] (upstream's shape: clients read
`text_output[0]`); every other output is the engine's, [1, ...].
Every response with text also carries num_output_tokens: the tokens behind that text (the engine's own
count when it sends one, else the length of its output_ids), summed over the deltas when stream=false.
Every input of upstream's BLS at the contract version is accepted: the request is validated first
(pipeline/runtime/validate.py; the multimodal and draft-model inputs only at their defaults), then its
inputs go where upstream's ensemble sends them (pipeline/runtime/tensors.py) and every output the engine
returns beside the tokens (log probs, perf metrics, num_input_tokens) is passed back.
An error from any step is answered as this request's error, with that step's message; bad requests as
INVALID_ARG (HTTP 400). Parameters: tensorrt_llm_model_name, contract_version (the request language:
`latest`, or the engine target's TensorRT-LLM line), engine_counts_tokens (false for engines without a
num_output_tokens output, such as v0.16's).
"""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.runtime.model_args import CancelWatch, model_params, triton_error
from pipeline.runtime.tensors import (
    ENGINE_INPUT_NAMES,
    PRE_TO_ENGINE,
    PREPROCESSING_INPUT_NAMES,
    TRTLLM_IO,
    VALIDATED_INPUTS,
    request_specs,
)
from pipeline.runtime.validate import ALL_FEATURES, Limits, RequestError, check

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Inputs only upstream's multimodal / speculative BLS uses: refused unless at their default.
BLS_ONLY = frozenset(
    {"image_input", "image_bytes_input", "image_url_input", "image_sizes_input", "video_bytes_input"}
    | {"num_draft_tokens", "use_draft_logits"}
)
TOKEN_OUTPUTS = ("output_ids", "sequence_length", "num_output_tokens")


class StepError(Exception):
    """A step answered with an error: its message (and whether it was the client's) goes back unchanged."""

    def __init__(self, message: str, invalid: bool) -> None:
        super().__init__(message)
        self.invalid = invalid


def checked(response, step: str):
    if response.has_error():
        error = response.error()
        code = getattr(error, "code", lambda: None)()
        raise StepError(
            error.message(), code is not None and code == getattr(pb_utils.TritonError, "INVALID_ARG", -1)
        )
    return response


def count_tensor(n: int):
    return pb_utils.Tensor("num_output_tokens", np.array([[n]], dtype=np.int32))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        _, params = model_params(args)
        self.engine = params.get("tensorrt_llm_model_name") or "tensorrt_llm"
        version = params.get("contract_version") or "latest"
        self.inputs = [spec.name for spec in request_specs("tensorrt_llm_bls", version, "in")]
        self.to_engine = ENGINE_INPUT_NAMES[version]
        self.to_pre = {
            **PREPROCESSING_INPUT_NAMES,
            **{row[0]: row[0] for row in VALIDATED_INPUTS[version]},
        }
        bls_out = {spec.name for spec in request_specs("tensorrt_llm_bls", version, "out")}
        engine_out = [row[0] for row in TRTLLM_IO[version]["out"]]
        self.outputs = ["output_ids", "sequence_length"]
        if params.get("engine_counts_tokens", "true").lower() in ("true", "1", "yes"):
            self.outputs.append("num_output_tokens")
        self.extras = [name for name in engine_out if name in bls_out and name not in TOKEN_OUTPUTS]
        self.outputs += self.extras
        # ranges, and the inputs no engine behind this model takes (the engine checks the rest)
        self.limits = Limits(target="tensorrt_llm_bls", supported=ALL_FEATURES - BLS_ONLY)

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            threading.Thread(target=self._run, args=(request, sender), daemon=True).start()
        return None

    def _run(self, request, sender) -> None:
        try:
            self._generate(request, sender)
        except StepError as exc:
            self._fail(sender, str(exc), exc.invalid)
        except RequestError as exc:
            self._fail(sender, f"tensorrt_llm_bls: {exc}", True)
        except Exception as exc:
            self._fail(sender, f"tensorrt_llm_bls: {exc}", False)

    def _generate(self, request, sender) -> None:
        given = {name: t for name in self.inputs if (t := pb_utils.get_input_tensor_by_name(request, name))}
        # max_tokens, end_id and pad_id are checked by preprocessing, which knows the cap and the vocabulary
        check({name: t.as_numpy() for name, t in given.items() if name != "max_tokens"}, self.limits)
        inputs = self._engine_inputs(given)
        stream = "stream" in given and bool(given["stream"].as_numpy().reshape(-1)[0])
        responses = pb_utils.InferenceRequest(
            model_name=self.engine, inputs=inputs, requested_output_names=self.outputs
        ).exec(decoupled=True)
        texts: list[np.ndarray] = []
        extras: dict[str, np.ndarray] = {}
        total = 0
        gone = CancelWatch(sender)
        for response in responses:
            checked(response, self.engine)
            if gone():
                sender.send(flags=FINAL)
                return
            got = {name: pb_utils.get_output_tensor_by_name(response, name) for name in self.extras}
            got = {name: t.as_numpy() for name, t in got.items() if t is not None}
            delta = self._delta(response)
            if delta is None:  # an empty (flags-only) final response
                extras.update(got)
                continue
            text, n = delta
            if stream:
                out = [pb_utils.Tensor("text_output", text), count_tensor(n)]
                out += [pb_utils.Tensor(name, value) for name, value in got.items()]
                sender.send(pb_utils.InferenceResponse(output_tensors=out))
            else:
                texts.append(text)
                total += n
                extras.update(got)  # per-request values: the last response's are the whole request's
        if stream:
            sender.send(flags=FINAL)
            return
        self._send_whole(sender, texts, total, extras)

    def _engine_inputs(self, given: dict) -> list:
        """The engine's input tensors: preprocessing's outputs (the prompt's ids and lengths, the limits it
        checked) and the request's own tensors the engine takes as they are."""
        pre = checked(
            pb_utils.InferenceRequest(
                model_name="preprocessing",
                requested_output_names=list(PRE_TO_ENGINE),
                inputs=[
                    pb_utils.Tensor(self.to_pre[n], t.as_numpy())
                    for n, t in given.items()
                    if n in self.to_pre
                ],
            ).exec(),
            "preprocessing",
        )
        inputs = [
            pb_utils.Tensor(dst, pb_utils.get_output_tensor_by_name(pre, src).as_numpy())
            for src, (_, dst) in PRE_TO_ENGINE.items()
        ]
        return inputs + [
            pb_utils.Tensor(self.to_engine[n], t.as_numpy()) for n, t in given.items() if n in self.to_engine
        ]

    def _delta(self, response) -> tuple[np.ndarray, int] | None:
        """One engine response's text (postprocessing's) and its token count; None for an empty response."""
        ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
        lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length")
        if ids is None or lengths is None:
            return None
        text = self._detokenize(ids.as_numpy(), lengths.as_numpy())
        counted = pb_utils.get_output_tensor_by_name(response, "num_output_tokens")
        n = (
            int(counted.as_numpy().reshape(-1)[0])
            if counted is not None
            else int(lengths.as_numpy().reshape(-1)[0])
        )
        return text, n

    @staticmethod
    def _send_whole(sender, texts: list[np.ndarray], total: int, extras: dict[str, np.ndarray]) -> None:
        """A non-streamed request's one response: [beams], postprocessing's (and upstream's) shape: one
        string per beam, the deltas joined."""
        whole = np.array(
            [b"".join(parts) for parts in zip(*(t.reshape(-1) for t in texts), strict=True)]
            if texts
            else [b""],
            dtype=np.object_,
        )
        out = [pb_utils.Tensor("text_output", whole), count_tensor(total)]
        out += [pb_utils.Tensor(name, value) for name, value in extras.items()]
        sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=FINAL)

    def _detokenize(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        post = checked(
            pb_utils.InferenceRequest(
                model_name="postprocessing",
                requested_output_names=["OUTPUT"],
                inputs=[pb_utils.Tensor("TOKENS_BATCH", ids), pb_utils.Tensor("SEQUENCE_LENGTH", lengths)],
            ).exec(),
            "postprocessing",
        )
        return pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy()

    @staticmethod
    def _fail(sender, message: str, invalid: bool) -> None:
        """INVALID_ARG (HTTP 400) for a bad request, so clients tell their mistakes from server faults."""
        sender.send(pb_utils.InferenceResponse(error=triton_error(message, invalid)), flags=FINAL)
