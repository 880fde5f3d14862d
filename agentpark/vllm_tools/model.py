"""``agentpark make-model``: a small random-weight Llama checkpoint that vLLM can serve.

No model can be downloaded where agentpark is tested (no hub), so the tests, the vLLM bench
and a first try use one made on the machine: a Llama config saved with transformers'
``save_pretrained`` (bfloat16 weights drawn from one seeded generator, so the same seed
gives the same bytes), plus a byte-level BPE tokenizer trained with ``tokenizers`` on the
Python standard library's ``.py`` files (on every machine), saved as a
``PreTrainedTokenizerFast`` with a ChatML-style chat template that renders system, user,
assistant (with ``tool_calls``) and tool messages. The special tokens ``<tool_call>`` /
``</tool_call>`` make vLLM's ``hermes`` tool parser accept the model.

torch, transformers and tokenizers come from the ``agentpark[vllm]`` extra and are imported
only when a model is made.
"""

from __future__ import annotations

import json
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentpark.errors import ConfigError

__all__ = [
    "CHAT_TEMPLATE",
    "INSTALL_HINT",
    "SPECIAL_TOKENS",
    "ModelSpec",
    "corpus_files",
    "make_model",
]

INSTALL_HINT = "pip install 'agentpark[vllm]'"

# ChatML roles; <|im_end|> ends every message and is the model's end of sequence.
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (
    PAD_TOKEN,
    "<|im_start|>",
    EOS_TOKEN,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# Arguments arrive as a JSON string from OpenAI clients, or as a dict when vLLM has parsed
# them first: both render the same way. Tools given with the request go in the system turn.
# No whitespace control ({%- -%}): the template has no incidental whitespace to trim, and
# trimming would eat the newlines that end messages.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "<tools>{{ tools | tojson }}</tools><|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% if not (tools and loop.first) %}"
    "<|im_start|>system\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{% set fn = call.function if call.function is defined else call %}"
    '<tool_call>{"name": {{ fn.name | tojson }}, "arguments": '
    "{% if fn.arguments is string %}{{ fn.arguments }}"
    "{% else %}{{ fn.arguments | tojson }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>tool\n<tool_response>{{ message.content }}</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """The checkpoint's shape; the defaults are the tests' tiny model (~0.4M parameters)."""

    layers: int = 2
    hidden: int = 64
    heads: int = 2
    kv_heads: int | None = None  # None: as many as heads (no grouped-query attention)
    vocab: int = 2048
    max_positions: int = 4096
    intermediate: int | None = None  # None: 4 x hidden
    seed: int = 0
    corpus_bytes: int = 4 << 20  # standard-library text the tokenizer is trained on

    def check(self) -> None:
        """Refuse shapes vLLM's CPU attention cannot run, before anything is built."""
        if min(self.layers, self.hidden, self.heads, self.max_positions) < 1:
            raise ConfigError("layers, hidden, heads and max positions must be >= 1")
        if self.hidden % self.heads:
            raise ConfigError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.head_dim < 32 or self.head_dim % 16:
            raise ConfigError(
                f"head_dim = hidden / heads = {self.head_dim}: vLLM's CPU attention needs "
                "a multiple of 16, at least 32"
            )
        kv = self.num_kv_heads
        if kv < 1 or self.heads % kv:
            raise ConfigError(f"kv heads {kv} must divide heads {self.heads}")
        if self.vocab < 512:
            raise ConfigError(f"vocab {self.vocab} is below 512 (256 bytes + merges)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads


Progress = Callable[[str], None]


def _stderr(line: str) -> None:
    print(f"make-model: {line}", file=sys.stderr, flush=True)


def corpus_files() -> list[Path]:
    """The standard library's own top-level ``.py`` files, sorted: the same on every run."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    if not files:
        raise ConfigError(f"no .py files in the standard library at {stdlib} to train on")
    return files


def _corpus(limit: int) -> Iterator[str]:
    """Lines of the standard library's text, in a fixed order, up to ``limit`` bytes."""
    total = 0
    for path in corpus_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines(keepends=True):
            total += len(line)
            yield line
            if total >= limit:
                return


def _imports() -> tuple[Any, Any, Any]:
    try:
        import tokenizers
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError(
            f"make-model needs torch, transformers and tokenizers ({exc}): {INSTALL_HINT}"
        ) from None
    return torch, transformers, tokenizers


def train_tokenizer(spec: ModelSpec, progress: Progress = _stderr) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` of at most ``spec.vocab`` tokens."""
    _, transformers, tokenizers = _imports()
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = corpus_files()
    progress(
        f"training a byte-level BPE tokenizer (vocab {spec.vocab}) on up to "
        f"{spec.corpus_bytes / 2**20:.1f} MiB of {len(files)} standard-library files"
    )
    started = time.monotonic()
    tok.train_from_iterator(_corpus(spec.corpus_bytes), trainer=trainer)
    progress(f"tokenizer: {tok.get_vocab_size()} tokens in {time.monotonic() - started:.1f} s")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=spec.max_positions,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(spec: ModelSpec, tokenizer: Any, progress: Progress = _stderr) -> Any:
    """A ``LlamaForCausalLM`` in bfloat16 with weights from one generator seeded by the spec.

    Every parameter is drawn here, in name order, rather than by transformers' own
    initialisers: the bytes depend on the seed and the shape only, not on how a release of
    transformers happens to initialise.
    """
    torch, transformers, _ = _imports()
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate or 4 * spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        bos_token_id=None,
    )
    config.dtype = "bfloat16"
    model = transformers.LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model = model.to(torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    progress(
        f"Llama: {spec.layers} layers, hidden {spec.hidden}, {spec.heads} heads "
        f"(head_dim {spec.head_dim}, {spec.num_kv_heads} kv), vocab {spec.vocab}: "
        f"{count / 1e6:.2f}M parameters, bfloat16"
    )
    return model


def make_model(
    directory: Path, spec: ModelSpec, *, force: bool = False, progress: Progress = _stderr
) -> Path:
    """Write the checkpoint and tokenizer into ``directory``; return it.

    A non-empty directory is refused unless ``force``: a typo must not overwrite a model.
    """
    spec.check()
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()) and not force:
        raise ConfigError(f"{directory} is not empty (--force writes into it anyway)")
    tokenizer = train_tokenizer(spec, progress)
    model = build_model(spec, tokenizer, progress)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "agentpark-model.json").write_text(
        json.dumps({"made_by": "agentpark make-model", **spec.__dict__}, indent=2) + "\n"
    )
    progress(f"saved to {directory}")
    return directory
