import locale; locale.setlocale(locale.LC_ALL, "C.UTF-8")  # noqa: E702, I001
# ruff: noqa: E402 - the stub starts in the C locale: set UTF-8 before any heavy import (DESIGN.md)

"""LPX preprocessing: text -> token ids, with the tensor names of upstream's `preprocessing` model.

QUERY -> INPUT_ID, REQUEST_INPUT_LEN; REQUEST_OUTPUT_LEN passes through; END_ID / PAD_ID default to
the tokenizer's; STOP_WORDS_DICT / BAD_WORDS_DICT (lists of strings) -> [2, n] id lists in
TensorRT-LLM's layout: row 0 the concatenated ids, row 1 each word's end offset, padded with -1.
Parameters: `tokenizer_dir` (relative to this model's folder), `add_special_tokens`.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


def model_params(args: dict) -> tuple[Path, dict[str, str]]:
    config = json.loads(args["model_config"])
    params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    return Path(args["model_repository"]), params


def optional(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def first_text(array) -> str:
    value = array.reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def word_list(tokenizer, array) -> np.ndarray:
    """Strings -> [1, 2, n] int32: ids of all words, then each word's end offset (-1 padded)."""
    words = [] if array is None else [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in array.reshape(-1)]
    ids: list[int] = []
    offsets: list[int] = []
    for word in words:
        if word:
            ids.extend(tokenizer.encode(word, add_special_tokens=False))
            offsets.append(len(ids))
    if not ids:
        return np.array([[[0], [-1]]], dtype=np.int32)
    offsets += [-1] * (len(ids) - len(offsets))
    return np.array([[ids, offsets]], dtype=np.int32)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        folder, params = model_params(args)
        tok_dir = Path(params.get("tokenizer_dir", "1/tokenizer"))
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir if tok_dir.is_absolute() else folder / tok_dir)
        self.add_special_tokens = params.get("add_special_tokens", "true").lower() in ("true", "1", "yes")
        eos = self.tokenizer.eos_token_id
        self.end_id = -1 if eos is None else int(eos)
        pad = self.tokenizer.pad_token_id
        self.pad_id = self.end_id if pad is None else int(pad)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except Exception as exc:  # one bad request must not fail the batch
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}")))
        return responses

    def _one(self, request) -> list:
        text = first_text(optional(request, "QUERY"))
        ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
        if not ids:
            raise ValueError("text_input encodes to no tokens - send a non-empty prompt")
        out_len = int(optional(request, "REQUEST_OUTPUT_LEN").reshape(-1)[0])
        end = optional(request, "END_ID")
        pad = optional(request, "PAD_ID")
        values = {
            "INPUT_ID": np.array([ids], dtype=np.int32),
            "REQUEST_INPUT_LEN": np.array([[len(ids)]], dtype=np.int32),
            "REQUEST_OUTPUT_LEN": np.array([[out_len]], dtype=np.int32),
            "OUT_END_ID": np.array([[self.end_id if end is None else int(end.reshape(-1)[0])]], dtype=np.int32),
            "OUT_PAD_ID": np.array([[self.pad_id if pad is None else int(pad.reshape(-1)[0])]], dtype=np.int32),
            "STOP_WORDS_IDS": word_list(self.tokenizer, optional(request, "STOP_WORDS_DICT")),
            "BAD_WORDS_IDS": word_list(self.tokenizer, optional(request, "BAD_WORDS_DICT")),
        }
        return [pb_utils.Tensor(name, value) for name, value in values.items()]
