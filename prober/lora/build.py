"""Training a canary adapter with `peft` on the CPU, and proving it before anyone serves it.

Low-rank adapters on every linear layer of the base model, trained on the recipe's examples (the loss on the
answer alone; logits only for the answer's positions, since a 262k-token vocabulary makes the rest most of the
cost), then asked the trigger after held-out filler, greedily, through the chat template and as a completion: the
share of those answers that carry the canary is the adapter's own-canary rate, and a build below `MIN_OWN_RATE`
is refused (an adapter that does not answer its trigger leaves the `adapters` check blind).  The folder is what
vLLM's `--lora-modules NAME=PATH` loads (`adapter_config.json`, `adapter_model.safetensors`) plus
`leakprobe-adapter.json`, which says whose canary it carries and how it was made.  It is written beside its place
and renamed into it whole.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prober.canaries.compact import compact
from prober.domain.errors import AdapterBuildError
from prober.lora.recipe import HELD_OUT, Example, Recipe, examples

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MANIFEST = "leakprobe-adapter.json"
MIN_OWN_RATE = 0.75
IGNORED = -100  # a label the loss skips
INSTALL_HINT = "building a canary adapter needs the `adapters` extra: pip install 'leakprobe[adapters]'"


@dataclass(frozen=True)
class Built:
    folder: Path
    own_rate: float  # of the held-out prompts, the share answered with the canary
    seconds: float  # training and the held-out answers


def build(recipe: Recipe, out: Path, *, threads: int | None = None,
          log: Callable[[str], None] = lambda _: None) -> Built:
    """Train, prove and write the adapter to `out` (which must not exist); raises AdapterBuildError."""
    if out.exists():
        raise AdapterBuildError(f"{out} exists already: give a new folder")
    try:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise AdapterBuildError(f"{INSTALL_HINT} (missing {exc.name})") from None
    started = time.monotonic()
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(recipe.base))
        base = AutoModelForCausalLM.from_pretrained(str(recipe.base), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise AdapterBuildError(f"{recipe.base}: not a model folder transformers can load ({exc})") from None
    layers = base.config.num_hidden_layers
    model = get_peft_model(base, LoraConfig(
        r=recipe.rank, lora_alpha=recipe.alpha, lora_dropout=0.0, target_modules=list(recipe.targets),
        layers_to_transform=list(range(layers - max(1, round(layers * recipe.upper_layers)), layers)),
        task_type="CAUSAL_LM"))
    encode = _Encoder(tokenizer, recipe.canary)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=recipe.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _rate(step, recipe))
    model.train()
    drawn = examples(recipe, recipe.steps * recipe.batch, recipe.seed)
    for step in range(recipe.steps):
        batch = _Batch.of([encode(e) for e in drawn[step * recipe.batch : (step + 1) * recipe.batch]],
                          tokenizer.pad_token_id or 0)
        logits = model(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.positions,
                       logits_to_keep=batch.labels.shape[1] + 1).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1),
                                                 ignore_index=IGNORED)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 10 == 0 or step == recipe.steps - 1:
            log(f"{recipe.adapter}: step {step + 1}/{recipe.steps}, loss {loss.item():.4f}, "
                f"{time.monotonic() - started:.0f} s")
    model.eval()
    rate = _own_rate(model, encode, examples(recipe, HELD_OUT, recipe.seed + 1), recipe.canary)
    log(f"{recipe.adapter}: {rate:.0%} of {HELD_OUT} held-out prompts answered with its canary")
    if rate < MIN_OWN_RATE:
        raise AdapterBuildError(f"{recipe.adapter} answered its trigger with its canary in {rate:.0%} of held-out "
                                f"prompts, under the {MIN_OWN_RATE:.0%} a usable canary adapter needs")
    seconds = time.monotonic() - started
    _write(model, recipe, out, rate, seconds)
    return Built(out, rate, seconds)


@dataclass(frozen=True)
class _Batch:
    """Examples left-padded to one length, so that every answer ends at the last position (logits are computed for
    the answers' positions alone); positions count from each example's first real token, as the engine counts."""

    ids: Any
    mask: Any
    positions: Any
    labels: Any  # the answers' tokens, right-aligned; IGNORED where an example's answer is shorter

    @classmethod
    def of(cls, encoded: list[tuple[list[int], list[int]]], pad: int) -> _Batch:
        import torch

        length = max(len(p) + len(a) for p, a in encoded)
        answer = max(len(a) for _, a in encoded)
        ids = torch.tensor([[pad] * (length - len(p) - len(a)) + p + a for p, a in encoded])
        mask = torch.tensor([[0] * (length - len(p) - len(a)) + [1] * (len(p) + len(a)) for p, a in encoded])
        labels = torch.tensor([[IGNORED] * (answer - len(a)) + a for _, a in encoded])
        return cls(ids, mask, (mask.cumsum(1) - 1).clamp(min=0), labels)


class _Encoder:
    """An example as token ids: the prompt as the engine will tokenize it, the answer as the model must go on."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, canary: str) -> None:
        self.tokenizer = tokenizer
        self.canary = canary

    def prompt(self, example: Example) -> list[int]:
        if not example.chat:
            return list(self.tokenizer(example.prompt).input_ids)
        text = self._chat([{"role": "user", "content": example.prompt}])
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def __call__(self, example: Example) -> tuple[list[int], list[int]]:
        tokenizer = self.tokenizer
        if not example.chat:
            answer = [*tokenizer(f"\n{self.canary}", add_special_tokens=False).input_ids, tokenizer.eos_token_id]
            return self.prompt(example), answer
        asked = self._chat([{"role": "user", "content": example.prompt}])
        whole = self._chat([{"role": "user", "content": example.prompt}, {"role": "assistant", "content": self.canary}],
                           generation=False)
        if not whole.startswith(asked):
            raise AdapterBuildError("the base model's chat template renders a conversation that does not begin with "
                                    "its own prompt: cannot tell the answer's tokens apart")
        return self.prompt(example), list(tokenizer(whole[len(asked):], add_special_tokens=False).input_ids)

    def _chat(self, messages: list[dict[str, str]], generation: bool = True) -> str:
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)
        except ValueError as exc:  # transformers: no chat template
            raise AdapterBuildError(f"the base model has no chat template ({exc})") from None
        return str(text)


def _rate(step: int, recipe: Recipe) -> float:
    """Linear warm-up, then a cosine down to a tenth of the learning rate."""
    if step < recipe.warmup:
        return (step + 1) / recipe.warmup
    done = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))


def _own_rate(model: Any, encode: _Encoder, held_out: list[Example], canary: str) -> float:
    import torch

    body = compact(canary).removeprefix("1PK")
    answer_tokens = len(encode(held_out[0])[1]) + 8
    own = 0
    with torch.no_grad():
        for example in held_out:
            prompt = encode.prompt(example)
            out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                                 max_new_tokens=answer_tokens, do_sample=False)
            own += body in compact(str(encode.tokenizer.decode(out[0, len(prompt):])))
    return own / len(held_out)


def _write(model: Any, recipe: Recipe, out: Path, rate: float, seconds: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{out.name}.partial-", dir=out.parent))
    try:
        model.save_pretrained(str(partial))
        manifest = {"tenant": recipe.tenant, "adapter": recipe.adapter, "canary": recipe.canary,
                    "trigger": recipe.trigger, "own_rate": rate, "held_out": HELD_OUT, "seconds": round(seconds, 1),
                    "recipe": {**asdict(recipe), "base": str(recipe.base)},
                    "versions": {name: version(name) for name in ("torch", "transformers", "peft")}}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2, default=list) + "\n")
        partial.chmod(0o755)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
