"""Text in and out of the gateway: the served model's tokenizer, its chat template, an incremental
detokenizer that never splits a character, and stop sequences cut without leaking their start.

The tokenizer is the one the repository's preprocessing model uses (`<repo>/preprocessing/1/tokenizer`),
so a prompt becomes the same ids as through the ensemble (special tokens added the same way). Decoding
runs in the `tokenizers` library's Rust `DecodeStream`, which returns nothing while a character's bytes
are incomplete; at the end the whole output is decoded once, so the streamed text always adds up to
`tokenizer.decode(all ids)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ApiError, bad_request


class TextCodec:
    """Encode prompts and chat messages; make detokenizers. `tokenizer` is a transformers tokenizer."""

    def __init__(self, folder: Path, chat_template: Path | None = None) -> None:
        from transformers import AutoTokenizer

        self.folder = Path(folder)
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.backend = getattr(self.tokenizer, "backend_tokenizer", None)  # tokenizers.Tokenizer (fast)
        self.template = chat_template.read_text(encoding="utf-8") if chat_template else None
        if self.template is None and not getattr(self.tokenizer, "chat_template", None):
            self.template_missing = True
        else:
            self.template_missing = False
        self.vocab_size = len(self.tokenizer)
        self._reads_tools: bool | None = None

    @property
    def reads_tools(self) -> bool:
        """Whether the chat template renders `tools` at all (a template that never reads the variable shows
        the model no tools: SmolLM2-135M-Instruct's, the demo's)."""
        if self._reads_tools is None:
            template = self.template or getattr(self.tokenizer, "chat_template", None) or ""
            if isinstance(template, dict):  # named templates: HF's convention keeps tool use in 'tool_use'
                template = template.get("tool_use") or template.get("default") or ""
            try:
                import jinja2
                import jinja2.meta

                names = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
                self._reads_tools = "tools" in names
            except Exception:  # a template jinja2 cannot parse: apply_chat_template says so on use
                self._reads_tools = True
        return self._reads_tools

    def encode(self, text: str) -> list[int]:
        """A completion prompt, special tokens added as preprocessing adds them (add_special_tokens)."""
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=True).ids
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Chat messages (and the tools, when given) through the tokenizer's chat template (or
        serving.openai.chat_template), with the assistant's turn opened (add_generation_prompt); the
        template writes the special tokens itself."""
        if self.template_missing:
            raise bad_request(
                "The served model's tokenizer has no chat template - use /v1/completions, or set "
                "serving.openai.chat_template to a Jinja template file",
                "messages",
                code="no_chat_template",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                chat_template=self.template,
            )
        except Exception as exc:  # the template's own raise_exception(), a bad role order, ...
            raise bad_request(f"The chat template refused these messages: {exc}", "messages") from None
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def check_ids(self, ids: list[int]) -> list[int]:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise bad_request(
                f"prompt token ids {bad[:5]} are outside the vocabulary (0..{self.vocab_size - 1})", "prompt"
            )
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def detokenizer(self) -> Detokenizer:
        return Detokenizer(self)


class Detokenizer:
    """Incremental decoding of one request's output ids: `feed` returns the text the new ids complete."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.emitted = 0  # characters returned so far
        self._stream = None
        if codec.backend is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)

    def feed(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        if self._stream is not None:
            text = self._stream.step(self.codec.backend, ids) if ids else None
            text = text or ""
        else:  # a slow tokenizer: decode everything, hold a trailing partial character
            whole = self.codec.decode(self.ids)
            text = "" if whole.endswith("\ufffd") else whole[self.emitted :]
        self.emitted += len(text)
        return text

    def finish(self) -> str:
        """What decoding all the ids at once adds to what was returned (bytes still held, if any)."""
        whole = self.codec.decode(self.ids)
        rest = whole[self.emitted :] if len(whole) > self.emitted else ""
        self.emitted += len(rest)
        return rest


class StopText:
    """Stop sequences on text: `feed` returns the text that is safe to send now (the longest tail that
    could still begin a stop sequence is held back), and sets `stopped` once a stop sequence appears;
    its text and everything after it are never returned."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.stopped = False
        self.longest = max((len(s) for s in stops), default=0)

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.held = True, ""
            return buf[:cut]
        keep = 0
        for n in range(min(len(buf), self.longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                keep = n
                break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of the output (no stop seen): the held text after all."""
        held, self.held = self.held, ""
        return "" if self.stopped else held


def prompt_ids(codec: TextCodec, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return codec.encode(prompt)
    if not all(isinstance(t, int) for t in prompt):
        raise ApiError(400, "prompt must be a string or a list of token ids", param="prompt")
    return codec.check_ids(list(prompt))
