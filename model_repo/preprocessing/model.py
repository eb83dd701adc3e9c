import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")
# ruff: noqa: E402 - the stub starts in the C locale: set UTF-8 before any heavy import (docs/architecture.md)

"""LPX preprocessing: text -> token ids, with the tensor names of upstream's `preprocessing` model.

QUERY -> INPUT_ID, REQUEST_INPUT_LEN; REQUEST_OUTPUT_LEN passes through; END_ID / PAD_ID default to
the first end-of-sequence id of generation_config.json (else the tokenizer's); STOP_WORDS_DICT /
BAD_WORDS_DICT (lists of strings) -> [2, n] id lists in TensorRT-LLM's layout: row 0 the
concatenated ids, row 1 each word's end offset, padded with -1. Every OTHER end-of-sequence id of
generation_config.json (it may list several, e.g. Llama 3's <|eot_id|>) is appended as a one-token
stop word, so generation ends on any of them whatever engine runs behind (the tensorrt_llm model
takes a single end_id).
Requests are checked here, with a clear error rather than truncation: text_input must be non-empty
UTF-8, max_tokens within 1..max_tokens_cap, the prompt at most max_input_len tokens.
Parameters: `tokenizer_dir` (relative to this model's folder), `add_special_tokens`,
`apply_chat_template` (wrap text_input as one user turn with the tokenizer's chat template),
`max_input_len`, `max_tokens_cap` (0 or absent: no check).
"""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from pipeline.runtime.limits import input_refusal
from pipeline.runtime.model_args import end_ids, model_params, triton_error
from pipeline.runtime.tensors import VALIDATED_INPUTS
from pipeline.runtime.validate import ALL_FEATURES, Limits, RequestError, check


def optional(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def first_text(array) -> str:
    if array is None or array.size == 0:
        raise ValueError("text_input is missing - send the prompt as text_input (BYTES)")
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"text_input is not valid UTF-8 (byte 0x{value[exc.start]:02x} at offset {exc.start})"
                " - send the prompt as UTF-8 text"
            ) from None
    text = str(value)
    if not text.strip():
        raise ValueError("text_input is empty - send a non-empty prompt")
    return text


def prompt_ids(tokenizer, text: str, add_special_tokens: bool, chat: bool) -> list[int]:
    """Token ids of the prompt; with `chat`, text is one user turn in the tokenizer's chat template
    (the template writes its own special tokens, so none are added on top)."""
    if chat:
        templated = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer.encode(templated, add_special_tokens=False)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def with_stops(stops: np.ndarray, extra: list[int]) -> np.ndarray:
    """Append one-token stop words (the extra end ids) to a [1, 2, n] word list."""
    if not extra:
        return stops
    ids, offsets = stops[0][0].tolist(), stops[0][1].tolist()
    n = offsets.index(-1) if -1 in offsets else len(offsets)
    if n == 0:
        ids, offsets = [], []
    else:
        ids, offsets = ids[: offsets[n - 1]], offsets[:n]
    for token in extra:
        ids.append(token)
        offsets.append(len(ids))
    offsets += [-1] * (len(ids) - len(offsets))
    return np.array([[ids, offsets]], dtype=np.int32)


def word_list(tokenizer, array) -> np.ndarray:
    """Strings -> [1, 2, n] int32: ids of all words, then each word's end offset (-1 padded)."""
    words = (
        []
        if array is None
        else [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in array.reshape(-1)]
    )
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
        self.chat = params.get("apply_chat_template", "false").lower() in ("true", "1", "yes")
        if self.chat and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"apply_chat_template is on but the tokenizer in {tok_dir} has no chat template - "
                "turn it off in pipeline/stages/repository/model_configs.py or use a tokenizer with one"
            )
        self.max_input_len = int(params.get("max_input_len") or 0)
        self.cap = int(params.get("max_tokens_cap") or 0)
        self.end_ids = end_ids(tok_dir if tok_dir.is_absolute() else folder / tok_dir, self.tokenizer)
        self.end_id = self.end_ids[0] if self.end_ids else -1
        pad = self.tokenizer.pad_token_id
        self.pad_id = self.end_id if pad is None else int(pad)
        self.validated = [row[0] for row in VALIDATED_INPUTS[params.get("contract_version") or "latest"]]
        # ranges only: what each target honours is checked by its tensorrt_llm model (or TensorRT-LLM)
        self.limits = Limits(
            vocab_size=len(self.tokenizer),
            max_input_len=self.max_input_len,
            max_seq_len=int(params.get("max_seq_len") or 0),
            max_tokens_cap=self.cap,
            max_beam_width=int(params.get("max_beam_width") or 0),
            target="any",
            supported=ALL_FEATURES,
        )

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except Exception as exc:  # one bad request must not fail the batch
                responses.append(
                    pb_utils.InferenceResponse(
                        error=triton_error(f"preprocessing: {exc}", isinstance(exc, ValueError))
                    )
                )
        return responses

    def _one(self, request) -> list:
        text = first_text(optional(request, "QUERY"))
        decoder = optional(request, "DECODER_QUERY")
        if decoder is not None and any(v for v in decoder.reshape(-1)):
            raise RequestError(
                "decoder_text_input is for encoder-decoder models - LPX serves decoder-only models: "
                "send the prompt as text_input only"
            )
        ids = prompt_ids(self.tokenizer, text, self.add_special_tokens, self.chat)
        if not ids:
            raise RequestError("text_input encodes to no tokens - send a non-empty prompt")
        out_len_tensor = optional(request, "REQUEST_OUTPUT_LEN")
        if out_len_tensor is None:
            raise RequestError("max_tokens is missing - send the number of tokens to generate")
        values = {name: optional(request, name) for name in self.validated}
        out_len = int(out_len_tensor.reshape(-1)[0])
        values.update(
            max_tokens=out_len_tensor,
            end_id=optional(request, "END_ID"),
            pad_id=optional(request, "PAD_ID"),
            embedding_bias_words=optional(request, "EMBEDDING_BIAS_WORDS"),
            embedding_bias_weights=optional(request, "EMBEDDING_BIAS_WEIGHTS"),
        )
        if refusal := input_refusal(len(ids), self.limits):  # the prompt first: its fix differs
            raise RequestError(refusal.message)
        check(values, self.limits, n_prompt=len(ids))
        end = optional(request, "END_ID")
        pad = optional(request, "PAD_ID")
        end_id = self.end_id if end is None else int(end.reshape(-1)[0])
        stops = word_list(self.tokenizer, optional(request, "STOP_WORDS_DICT"))
        values = {
            "INPUT_ID": np.array([ids], dtype=np.int32),
            "REQUEST_INPUT_LEN": np.array([[len(ids)]], dtype=np.int32),
            "REQUEST_OUTPUT_LEN": np.array([[out_len]], dtype=np.int32),
            "OUT_END_ID": np.array([[end_id]], dtype=np.int32),
            "OUT_PAD_ID": np.array(
                [[self.pad_id if pad is None else int(pad.reshape(-1)[0])]], dtype=np.int32
            ),
            "STOP_WORDS_IDS": with_stops(stops, [i for i in self.end_ids if i != end_id]),
            "BAD_WORDS_IDS": word_list(self.tokenizer, optional(request, "BAD_WORDS_DICT")),
            "EMBEDDING_BIAS": self._bias(values["embedding_bias_words"], values["embedding_bias_weights"]),
            "OUT_PROMPT_TABLE_EXTRA_IDS": np.zeros((1, 0), dtype=np.uint64)
            if (extra := optional(request, "PROMPT_TABLE_EXTRA_ID")) is None
            else np.full((1, len(ids)), int(extra.reshape(-1)[0]), dtype=np.uint64),
        }
        return [pb_utils.Tensor(name, value) for name, value in values.items()]

    def _bias(self, words, weights) -> np.ndarray:
        """EMBEDDING_BIAS: a [1, vocab] float vector adding each word's weight to the logits of the word's
        tokens (upstream's layout); [1, 0] when no word is given, which every engine reads as none."""
        pairs = [
            (w.decode("utf-8") if isinstance(w, bytes) else str(w), float(x))
            for w, x in zip(
                [] if words is None else words.reshape(-1),
                [] if weights is None else weights.reshape(-1),
                strict=False,
            )
        ]
        pairs = [(w, x) for w, x in pairs if w]
        if not pairs:
            return np.zeros((1, 0), dtype=np.float32)
        bias = np.zeros((1, len(self.tokenizer)), dtype=np.float32)
        for word, weight in pairs:
            for token in self.tokenizer.encode(word, add_special_tokens=False):
                bias[0, token] += weight
        return bias
