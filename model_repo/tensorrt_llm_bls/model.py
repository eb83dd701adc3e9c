import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")
# ruff: noqa: E402 - the stub starts in the C locale: set UTF-8 before any heavy import (docs/architecture.md)

"""LPX's BLS model `tensorrt_llm_bls` (decoupled): the ensemble's request tensors in, text_output out,
with the pipeline run here instead of by Triton's ensemble scheduler.

Per request (each on its own thread, so requests progress together): preprocessing (one call),
then tensorrt_llm with `exec(decoupled=True)`, then postprocessing on every token delta the engine
streams. stream=true: one response per delta as it comes, then an empty FINAL response.
stream=false: exactly one response, FINAL, with the whole text (HTTP `generate` needs exactly one).
Every response with text also carries num_output_tokens: the tokens behind that text (the engine's own
count when it sends one, else the length of its output_ids), summed over the deltas when stream=false.
An error from any step is answered as this request's error, with that step's message.
Parameters: tensorrt_llm_model_name, seed_input_name (`random_seed` for v0.16 engines),
engine_counts_tokens (false for engines without a num_output_tokens output, such as v0.16's).
"""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.runtime.model_args import model_params

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# request tensor -> preprocessing input
PRE_INPUTS = {
    "text_input": "QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
}
# preprocessing output -> tensorrt_llm input
PRE_TO_ENGINE = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
    "STOP_WORDS_IDS": "stop_words_list",
    "BAD_WORDS_IDS": "bad_words_list",
}
# request tensor -> tensorrt_llm input (passed through when the client sent it)
SAMPLING = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "seed": "seed",
    "stream": "streaming",
    "exclude_input_in_output": "exclude_input_in_output",
}


class StepError(Exception):
    """A step answered with an error: its message goes back to the client unchanged."""


def checked(response, step: str):
    if response.has_error():
        raise StepError(response.error().message())
    return response


def count_tensor(n: int):
    return pb_utils.Tensor("num_output_tokens", np.array([[n]], dtype=np.int32))


def cancelled(sender) -> bool:
    check = getattr(sender, "is_cancelled", None)
    return bool(check and check())


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        _, params = model_params(args)
        self.engine = params.get("tensorrt_llm_model_name") or "tensorrt_llm"
        self.sampling = {**SAMPLING, "seed": params.get("seed_input_name") or "seed"}
        self.outputs = ["output_ids", "sequence_length"]
        if params.get("engine_counts_tokens", "true").lower() in ("true", "1", "yes"):
            self.outputs.append("num_output_tokens")

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            threading.Thread(target=self._run, args=(request, sender), daemon=True).start()
        return None

    def _run(self, request, sender) -> None:
        try:
            self._generate(request, sender)
        except StepError as exc:
            self._fail(sender, str(exc))
        except Exception as exc:
            self._fail(sender, f"tensorrt_llm_bls: {exc}")

    def _generate(self, request, sender) -> None:
        given = {name: pb_utils.get_input_tensor_by_name(request, name) for name in (*PRE_INPUTS, *SAMPLING)}
        pre = checked(
            pb_utils.InferenceRequest(
                model_name="preprocessing",
                requested_output_names=list(PRE_TO_ENGINE),
                inputs=[
                    pb_utils.Tensor(PRE_INPUTS[n], t.as_numpy())
                    for n, t in given.items()
                    if n in PRE_INPUTS and t is not None
                ],
            ).exec(),
            "preprocessing",
        )
        inputs = [
            pb_utils.Tensor(dst, pb_utils.get_output_tensor_by_name(pre, src).as_numpy())
            for src, dst in PRE_TO_ENGINE.items()
        ]
        inputs += [
            pb_utils.Tensor(self.sampling[n], t.as_numpy())
            for n, t in given.items()
            if n in SAMPLING and t is not None
        ]
        stream = given["stream"] is not None and bool(given["stream"].as_numpy().reshape(-1)[0])
        responses = pb_utils.InferenceRequest(
            model_name=self.engine, inputs=inputs, requested_output_names=self.outputs
        ).exec(decoupled=True)
        texts: list[np.ndarray] = []
        total = 0
        for response in responses:
            checked(response, self.engine)
            if cancelled(sender):
                sender.send(flags=FINAL)
                return
            ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
            lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length")
            if ids is None or lengths is None:  # an empty (flags-only) final response
                continue
            text = self._detokenize(ids.as_numpy(), lengths.as_numpy())
            counted = pb_utils.get_output_tensor_by_name(response, "num_output_tokens")
            n = (
                int(counted.as_numpy().reshape(-1)[0])
                if counted is not None
                else int(lengths.as_numpy().reshape(-1)[0])
            )
            if stream:
                sender.send(
                    pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("text_output", text), count_tensor(n)]
                    )
                )
            else:
                texts.append(text)
                total += n
        if stream:
            sender.send(flags=FINAL)
            return
        whole = np.array(
            [[b"".join(parts) for parts in zip(*(t.reshape(-1) for t in texts), strict=True)]]
            if texts
            else [[b""]],
            dtype=np.object_,
        )
        sender.send(
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("text_output", whole), count_tensor(total)]
            ),
            flags=FINAL,
        )

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
    def _fail(sender, message: str) -> None:
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
