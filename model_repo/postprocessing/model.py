import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")
# ruff: noqa: E402 - the stub starts in the C locale: set UTF-8 before any heavy import (docs/architecture.md)

"""LPX postprocessing: token ids -> text, with the tensor names of upstream's `postprocessing` model.

TOKENS_BATCH [batch, beams, tokens] + SEQUENCE_LENGTH [batch, beams] -> OUTPUT [batch * beams] (UTF-8
bytes): one flat dimension, as upstream's postprocessing sends it (so [1] for one prompt), whatever the
config's [-1] dims with a batch dimension suggest. Upstream's clients read `text_output[0].decode()`
(tests/contracts/tensorrtllm_backend_models.json, `response_shapes`).

Stateless and delta-safe. In a stream every response carries only new tokens, and the engine
cuts those deltas at character boundaries (it holds tokens until a multi-byte character is
complete). What remains is the leading space: SentencePiece-style decoders drop the space of
the first token of a sequence, so decoding a delta on its own would glue words together. So
every decode is anchored: decode(ANCHOR + ids) minus the text of decode(ANCHOR), where ANCHOR is
one ordinary token. For byte-level BPE (GPT-2, Llama 3) this equals a plain decode; for
SentencePiece it keeps each delta's leading space. Streamed and non-streamed output use the same
rule, so the concatenated stream equals the one-shot text.
Parameters: `tokenizer_dir` (relative to this model's folder), `skip_special_tokens`.
"""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from pipeline.runtime.model_args import model_params


class AnchoredDecoder:
    """decode(ids) that keeps the leading space of `ids` as a continuation of earlier text."""

    def __init__(self, tokenizer, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.anchor = tokenizer.encode("a", add_special_tokens=False)[-1:]
        self.prefix = self._plain(self.anchor)
        probe = tokenizer.encode(" b", add_special_tokens=False)
        if not self.anchor or not self._plain(self.anchor + probe).startswith(self.prefix):
            self.anchor, self.prefix = [], ""  # this tokenizer does not compose: decode plainly

    def _plain(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)

    def __call__(self, ids: list[int]) -> str:
        if not ids:
            return ""
        text = self._plain(self.anchor + ids)
        return text[len(self.prefix) :] if text.startswith(self.prefix) else self._plain(ids)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        folder, params = model_params(args)
        tok_dir = Path(params.get("tokenizer_dir", "1/tokenizer"))
        tokenizer = AutoTokenizer.from_pretrained(tok_dir if tok_dir.is_absolute() else folder / tok_dir)
        skip = params.get("skip_special_tokens", "true").lower() in ("true", "1", "yes")
        self.decode = AnchoredDecoder(tokenizer, skip)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                lengths = lengths.reshape(-1)
                tokens = (
                    tokens.reshape(len(lengths), -1) if tokens.size else np.zeros((len(lengths), 0), np.int32)
                )
                texts = [
                    self.decode(beam[: int(n)].tolist()).encode("utf-8")
                    for beam, n in zip(tokens, lengths, strict=True)
                ]
                out = pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            except Exception as exc:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}"))
                )
        return responses
