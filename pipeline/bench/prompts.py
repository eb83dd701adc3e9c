"""Text prompts of an exact token count, counted the way the served model counts them.

The tokenizer is the served model's: `--tokenizer DIR`, else the repository being served
(`<repo>/preprocessing/1/tokenizer`; the repository is the one `lpx bench -c` serves, the one a running
`lpx serve` recorded, or the one a local tritonserver on that port was started with). The preprocessing
model's parameters (add_special_tokens, apply_chat_template), read from the server, say how it
tokenizes, so the count includes the special tokens and template it adds.

Without a tokenizer (a remote server), prompts are common English words, about one token each for
most tokenizers: the count is approximate, and the report says so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import NotFound, UsageError

log = logging.getLogger("lpx.bench")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
# no tokenizer: words that are one token in the usual LLM tokenizers (GPT-2/Llama/Qwen style)
COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no what more out "
    "up into do can only other new some could time these two may then first any my now such like our "
    "over man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three"
).split()


def _is_tokenizer_dir(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in TOKENIZER_FILES)


def repo_tokenizer(repo: Path) -> Path | None:
    """`<repo>/preprocessing/1/tokenizer` when it holds tokenizer files."""
    path = Path(repo) / "preprocessing" / "1" / "tokenizer"
    return path if _is_tokenizer_dir(path) else None


def _port(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)[-1]


def _local(url: str) -> bool:
    host = url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def served_repo(url: str) -> Path | None:
    """The model repository served at `url` when it is on this machine: the record of a running
    `lpx serve`, else the command line of a local tritonserver listening on that port (Linux)."""
    if not _local(url):
        return None
    port = _port(url)
    from ..served import running_server

    try:
        info = running_server()
        served = [info["grpc_url"], info["http_url"], info.get("openai_url") or ""]
        if port in {_port(str(u)) for u in served if u}:
            return Path(info["repo"])
    except NotFound:  # no `lpx serve` runs here: a tritonserver started otherwise may
        log.debug("no running lpx serve: looking for a local tritonserver on port %s", port)
    except (KeyError, TypeError) as exc:
        log.warning(
            "the running lpx serve's record lacks %s: its repository is not used; looking for a local "
            "tritonserver on port %s",
            exc,
            port,
        )
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            args = (pid / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not args or not Path(args[0]).name.startswith("tritonserver"):
            continue
        ports = {a.split("=", 1)[1] for a in args if a.startswith(("--grpc-port=", "--http-port="))}
        repos = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
        if port in ports and repos:
            return Path(repos[0])
    return None


def find_tokenizer(url: str, given: Path | None, repo: Path | None = None) -> Path | None:
    """The tokenizer folder to count with: `given`, else the served repository's; None if neither."""
    if given is not None:
        if not _is_tokenizer_dir(Path(given)):
            raise UsageError(
                f"--tokenizer {given}: no tokenizer files there ({', '.join(TOKENIZER_FILES)}) - pass the "
                "served model's tokenizer folder, e.g. <repo>/preprocessing/1/tokenizer or its HF checkpoint"
            )
        return Path(given)
    repo = repo or served_repo(url)
    return repo_tokenizer(repo) if repo is not None else None


NO_TOKENIZER_NOTE = (
    "no tokenizer for {url}: prompts are {n} common English words, about {n} tokens for most tokenizers "
    "but not exactly; measured ISL comes from the server's num_input_tokens where it returns it. "
    "For exact lengths pass --tokenizer DIR (the served model's tokenizer folder: "
    "<repo>/preprocessing/1/tokenizer on the server, or the model's Hugging Face checkpoint folder)."
)


def server_tokenization(url: str, protocol: str, model: str = "preprocessing") -> dict[str, bool]:
    """How the served preprocessing model tokenizes: {'add_special_tokens', 'chat'}, from its config
    parameters (LPX's defaults when the server cannot say)."""
    from tritonclient.utils import InferenceServerException

    params: dict[str, Any] = {}
    try:
        if protocol == "grpc":
            import tritonclient.grpc as client

            cfg = client.InferenceServerClient(url).get_model_config(model, as_json=True)["config"]
        else:
            import tritonclient.http as client

            cfg = client.InferenceServerClient(url.split("://", 1)[-1]).get_model_config(model)
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
    except (InferenceServerException, OSError, KeyError) as exc:
        log.warning(
            "cannot read the %s model's config at %s (%s): prompts are counted as LPX's preprocessing "
            "tokenizes (special tokens added, no chat template)",
            model,
            url,
            str(exc)[:200],
        )

    def flag(name: str, default: str) -> bool:
        return str(params.get(name, default)).lower() in ("true", "1", "yes")

    return {
        "add_special_tokens": flag("add_special_tokens", "true"),
        "chat": flag("apply_chat_template", "false"),
    }


@dataclass
class PromptMaker:
    """Builds prompts of an exact token count with the served model's tokenizer; counts prompts."""

    tokenizer: Any
    add_special_tokens: bool = True
    chat: bool = False
    folder: str = ""

    @classmethod
    def load(cls, folder: Path, add_special_tokens: bool = True, chat: bool = False) -> PromptMaker:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(folder))
        except Exception as exc:  # broad on purpose, never silent: any failure becomes the fix below
            raise UsageError(
                f"Cannot load the tokenizer in {folder} ({type(exc).__name__}: {str(exc)[:200]}) - "
                "pass the served model's tokenizer folder with --tokenizer DIR"
            ) from None
        if chat and not getattr(tok, "chat_template", None):
            chat = False
        maker = cls(tok, add_special_tokens, chat, str(folder))
        maker._words = maker._word_ids()
        return maker

    def count(self, text: str) -> int:
        """Tokens of `text` as the server's preprocessing encodes it (special tokens, chat template)."""
        if self.chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return len(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens))

    def _word_ids(self) -> np.ndarray:
        """Ids of ordinary vocabulary tokens (no special tokens), to draw random text from."""
        special = set(self.tokenizer.all_special_ids)
        ids = [i for i in range(len(self.tokenizer)) if i not in special]
        texts = self.tokenizer.batch_decode([[i] for i in ids])
        words = [i for i, t in zip(ids, texts, strict=True) if t.strip().isalpha()]
        return np.asarray(words or ids, dtype=np.int64)

    def make(self, n: int, rng: np.random.Generator) -> str:
        """Random text that the server counts as exactly `n` tokens; UsageError when `n` is below the
        tokens the server adds to any prompt, or when no text of that length can be found."""
        overhead = self.count("")
        body = n - overhead
        if body < 1:
            raise UsageError(
                f"--input-len {n} is too short: the served model adds {overhead} token(s) to every prompt "
                f"(special tokens / chat template) - use --input-len {overhead + 1} or more"
            )
        pool = rng.choice(self._words, size=body + 16 + body // 4)
        k, got, text = body, -1, ""
        for attempt in range(48):
            if k + 16 > len(pool):
                pool = np.concatenate([pool, rng.choice(self._words, size=k + 16 - len(pool))])
            text = self.tokenizer.decode(pool[:k].tolist(), skip_special_tokens=True)
            got = self.count(text)
            if got == n:
                return text
            if attempt >= 2:  # decode/encode merges at the end: draw new tail tokens and retry
                tail = max(1, k - 4)
                pool[tail:] = rng.choice(self._words, size=len(pool) - tail)
            k = max(1, k + (n - got))
        raise UsageError(
            f"Could not build a prompt of exactly {n} tokens with the tokenizer in {self.folder} "
            f"(closest: {got}) - try another --seed or --input-len"
        )


def common_words(n: int, rng: np.random.Generator) -> str:
    """`n` common English words (no tokenizer: about n tokens)."""
    return " ".join(COMMON_WORDS[int(i)] for i in rng.integers(len(COMMON_WORDS), size=max(1, n)))


def describe(maker: PromptMaker | None) -> dict[str, Any]:
    return (
        {"tokenizer": maker.folder, "add_special_tokens": maker.add_special_tokens, "chat": maker.chat}
        if maker
        else {"tokenizer": None}
    )
