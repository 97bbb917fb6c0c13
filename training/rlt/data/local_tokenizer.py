"""A model folder's tokenizer for `rlt validate`'s token counts without importing transformers (2 s of imports
before any work, which made the door too slow for CI and pre-commit hooks).

The tokenizer is the one transformers' AutoTokenizer builds for the folder (for some model types it rebuilds the
pipeline from the vocabulary, so tokenizer.json alone is not it): the first time a folder is checked AutoTokenizer
loads it, and its backend pipeline (the `tokenizers` library's own serialisation), special tokens and chat template
are kept in rlt's cache, keyed by the folder's tokenizer files and the installed versions; later checks read that
with `tokenizers` alone. jinja2's immutable sandbox renders the chat template with the environment transformers
gives it (trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception, strftime_now, the special tokens)
and the same continue_final_message rule; a template this renderer cannot take goes to transformers' renderer.
tests/unit/test_door_speed.py holds text and token ids equal to AutoTokenizer's on generated chats."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rlt.spec.local_files import TOKENIZER_BYTES, LocalFileError, path_words, read_json_object

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


@dataclass
class Encoded:
    input_ids: list[int]
    offset_mapping: list[tuple[int, int]] | None = None


def _cache_file(folder: Path) -> Path:
    """Where the folder's tokenizer is kept: a key over its tokenizer files' sizes and times and the versions."""
    from rlt.data.models import cache_root

    key = [str(folder.resolve()), version("transformers"), version("tokenizers")]
    for name in TOKENIZER_FILES:
        try:
            st = (folder / name).stat()
        except OSError:
            continue
        key.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(key).encode()).hexdigest()[:32]
    return cache_root() / "tokenizers" / f"{digest}.json"


def _from_autotokenizer(folder: Path, field: str) -> dict[str, Any]:
    """What AutoTokenizer builds for `folder`, written out (the slow path: imports transformers)."""
    from rlt.data.models import quiet_libraries

    quiet_libraries()  # transformers' notes are not the user's lines
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    backend = getattr(auto, "backend_tokenizer", None)
    if backend is None:
        raise LookupError("not a tokenizers-backed tokenizer")
    try:
        template = auto.get_chat_template()
    except ValueError:
        template = None
    return {"backend": backend.to_str(), "special": dict(auto.special_tokens_map), "template": template}


def _record(folder: Path, field: str) -> dict[str, Any]:
    cached = _cache_file(folder)
    if path_words(cached) is None:
        try:
            record: dict[str, Any] = read_json_object(cached, field, TOKENIZER_BYTES)
            return record
        except LocalFileError:
            pass  # a damaged cache entry is rebuilt
    record = _from_autotokenizer(folder, field)
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tok.", dir=cached.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    Path(tmp).replace(cached)  # atomic: a concurrent check reads the old or the new, never half
    return record


class FileTokenizer:
    """The slice of a transformers tokenizer that rlt.method.prompts.Formatter and the length check use."""

    def __init__(self, folder: Path, field: str):
        from tokenizers import Tokenizer

        self.folder, self.field = folder, field
        try:
            record = _record(folder, field)
        except (LocalFileError, LookupError):
            raise
        except Exception as err:  # noqa: BLE001 - transformers' and tokenizers' errors of a damaged folder, in one line
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise LocalFileError(f"{field}: the tokenizer in {folder} cannot be loaded ({first[:300]})") from None
        self._tok = Tokenizer.from_str(record["backend"])
        self.special: dict[str, str] = {k: v for k, v in record["special"].items() if isinstance(v, str)}
        template = record.get("template")
        if not isinstance(template, str) or not template.strip():
            raise LocalFileError(
                f"{field}: the tokenizer in {folder} has no chat template (tokenizer_config.json chat_template or "
                "chat_template.jinja); rlt renders the teacher's and the student's prompts with it: use an instruct "
                "model's tokenizer or add a template"
            )
        self.chat_template = template
        added = json.loads(record["backend"]).get("added_tokens") or []
        self.special_texts = [t["content"] for t in added if t.get("special") and t.get("content")]

    @property
    def eos_token(self) -> str | None:
        return self.special.get("eos_token")

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False, **options: Any) -> str:
        assert not tokenize, "FileTokenizer renders text only"
        try:
            return render_chat(self.chat_template, messages, self.special, **options)
        except Exception:  # noqa: BLE001 - anything this renderer cannot take: transformers' own renderer decides
            from transformers.utils.chat_template_utils import render_jinja_template

            kwargs: dict[str, Any] = {**options, **self.special}
            try:
                out: Any = render_jinja_template(conversations=[messages], chat_template=self.chat_template, **kwargs)
            except Exception as err:  # noqa: BLE001 - a template error (syntax, a dropped message) of the user's folder
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise LocalFileError(
                    f"{self.field}: the chat template of the tokenizer in {self.folder} cannot render rlt's prompts "
                    f"({type(err).__name__}: {first[:300]}); fix the template or use an instruct model's tokenizer"
                ) from None
            return str(out[0][0])  # (rendered chats, generation indices)

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> Encoded:
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return Encoded(enc.ids, list(enc.offsets) if return_offsets_mapping else None)


def special_texts(tokenizer: Any) -> list[str]:
    """The special tokens of a tokenizer (FileTokenizer or a transformers one) as text: what a row must not hold."""
    own = getattr(tokenizer, "special_texts", None)
    if own is not None:
        return list(own)
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return [t.content for t in decoder.values() if getattr(t, "special", False) and t.content]


def has_tokenizer(folder: Path) -> bool:
    return any(path_words(folder / name) is None for name in ("tokenizer.json", "tokenizer_config.json"))


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker for the end of the message to continue


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    import json
    from datetime import datetime

    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` renders its body (transformers tracks assistant spans with it)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat(
    template: str,
    messages: list[dict[str, str]],
    special: dict[str, str],
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
) -> str:
    """One chat rendered as transformers' apply_chat_template(tokenize=False) renders plain-text messages."""
    chat = [dict(m) for m in messages]
    final = ""
    if continue_final_message:
        final = chat[-1]["content"]
        if "content" not in template:
            raise ValueError("the chat template does not read the message content")
        chat[-1]["content"] = final + _CONTINUE_TAG
    text = str(
        _compiled(template).render(
            messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt, **special
        )
    )
    if continue_final_message:
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise ValueError("the chat template dropped part of the final message")
        at = text.rindex(_CONTINUE_TAG.strip())
        text = text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
    return text
