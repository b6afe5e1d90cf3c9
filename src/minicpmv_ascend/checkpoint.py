"""Write a random-weight MiniCPM-V 4.6 (Thinking) or 4.7 checkpoint that HF transformers and vLLM load.

The weights are random: the model's answers are noise. It exists so the serving stack can be run
and tested for real without the released weights (no model hub is reachable here).

Presets:
  tiny  a few MB, loads in seconds: tests and `make serve`.
  full  the released model's shapes (~1.3B parameters): honest speed numbers in benchmarks.

Models (`--model`, a `model_type` of minicpmv_ascend.common.models): minicpmv4_6 (the default) or
minicpmv4_7 (the same towers; its config adds the canvas M-RoPE fields: the layout token ids,
`mrope_mode`, and M-RoPE sections in the text tower's rope parameters).

Both use the released model's parameter names (they come from transformers' own
MiniCPMV4_6ForConditionalGeneration / MiniCPMV4_7ForConditionalGeneration), its config layout, a byte-level BPE tokenizer with the
Qwen-style and MiniCPM layout special tokens, the Thinking chat template, processor configs and a
generation config with stop tokens. Output is deterministic for a given seed.

The tokenizer: `tiny` trains a ~700-token one on a small corpus (its output matrix is as small);
`full` builds one with the released vocabulary's 248,094 rows, the Qwen3.5 special tokens at the
released ids (<|endoftext|> 248044, <|im_end|> 248046, <|image_pad|> 248056, <think> 248068 ...),
and text-like regular tokens, so that every id the model samples decodes to text, as the real
model's do: streaming, inter-token latency and detokenization cost what they cost at full size.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import sys

from minicpmv_ascend.common.models import DEFAULT_MODEL_TYPE, MODELS

# Special tokens in the order Qwen3.5 tokenizers add them, plus MiniCPM-V's layout tokens.
# (text, special): `special` tokens are dropped by `skip_special_tokens`; the thinking and tool
# markers (calls and responses) are not special in Qwen tokenizers, so the reasoning and tool parsers
# see them as text.
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<image>", True),
    ("</image>", True),
    ("<slice>", True),
    ("</slice>", True),
    ("<image_id>", True),
    ("</image_id>", True),
    ("<unk>", True),
)

# Attributes transformers' MiniCPMV4_6Processor and vLLM read from the tokenizer.
TOKENIZER_ROLE_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}

# Thinking-model chat template. It follows the released MiniCPM-V 4.6 template, which is Qwen3.5's
# with MiniCPM-V's image markers: the released template could not be read here (no model hub), but
# ports that recognise it key on Qwen3.5's tool instructions, `tool_call.arguments|items`,
# `<tool_response>`, `render_content(message.content)` and `<|image_pad|>`; the format is the one
# vLLM's `qwen3_coder` tool parser reads (vllm-project/recipes models/openbmb/MiniCPM-V-4.6.yaml):
# - tools go into a system turn (`# Tools`, one JSON object per tool inside <tools>), before the
#   caller's own system message;
# - an assistant tool call is `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
#   </function>\n</tool_call>` (objects and lists as JSON, everything else as text);
# - tool results go back in a user turn, each inside <tool_response>...</tool_response>;
# - reasoning is kept only for the assistant turns after the last real user message (a tool loop);
# - one addition: an assistant message that is an unfinished thought (`<think>` without `</think>`)
#   is rendered as written, so that `continue_final_message` continues the generation prompt (the
#   parity tool teacher-forces a reasoning continuation that way); Qwen3.5's would close an empty
#   think block before it;
# - the generation prompt opens `<think>` (thinking on by default); `enable_thinking=false` emits an
#   empty think block instead.
# Images and videos become `<|image_pad|>` / `<|video_pad|>`, which the processor expands into
# MiniCPM-V's slice layout.
CHAT_TEMPLATE = r"""{%- macro render_content(content, is_system_content=false) -%}
{%- if content is string -%}
{{- content -}}
{%- elif content is iterable and content is not mapping -%}
{%- for item in content -%}
{%- if 'image' in item or 'image_url' in item or item.type in ('image', 'image_url') -%}
{%- if is_system_content -%}{{- raise_exception('System message cannot contain images.') -}}{%- endif -%}
{{- '<|image_pad|>' -}}
{%- elif 'video' in item or 'video_url' in item or item.type in ('video', 'video_url') -%}
{%- if is_system_content -%}{{- raise_exception('System message cannot contain videos.') -}}{%- endif -%}
{{- '<|video_pad|>' -}}
{%- elif 'text' in item -%}
{{- item.text -}}
{%- else -%}
{{- raise_exception('Unexpected item type in content.') -}}
{%- endif -%}
{%- endfor -%}
{%- elif content is none or content is undefined -%}
{{- '' -}}
{%- else -%}
{{- raise_exception('Unexpected content type.') -}}
{%- endif -%}
{%- endmacro -%}
{%- if not messages -%}{{- raise_exception('No messages provided.') -}}{%- endif -%}
{%- if tools and tools is iterable and tools is not mapping -%}
{{- '<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' -}}
{%- if messages[0].role == 'system' -%}
{%- set system = render_content(messages[0].content, true) | trim -%}
{%- if system -%}{{- '\n\n' + system -}}{%- endif -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + (render_content(messages[0].content, true) | trim) + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages | length - 1) -%}
{%- for message in messages[::-1] -%}
{%- set index = (messages | length - 1) - loop.index0 -%}
{%- if ns.multi_step_tool and message.role == 'user' -%}
{%- set text = render_content(message.content) | trim -%}
{%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) -%}
{%- set ns.multi_step_tool = false -%}
{%- set ns.last_query_index = index -%}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if ns.multi_step_tool -%}{{- raise_exception('No user query found in messages.') -}}{%- endif -%}
{%- for message in messages -%}
{%- set content = render_content(message.content) | trim -%}
{%- if message.role == 'system' -%}
{%- if not loop.first -%}{{- raise_exception('System message must be at the beginning.') -}}{%- endif -%}
{%- elif message.role == 'user' -%}
{{- '<|im_start|>user\n' + content + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{%- set reasoning = message.reasoning_content if message.reasoning_content is string else message.reasoning -%}
{%- if reasoning is not string -%}
{%- set reasoning = '' -%}
{%- if '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- endif -%}
{%- if not reasoning and content.startswith('<think>') and '</think>' not in content -%}
{{- '<|im_start|>assistant\n' + render_content(message.content) -}}
{%- elif loop.index0 > ns.last_query_index -%}
{{- '<|im_start|>assistant\n<think>\n' + (reasoning | trim) + '\n</think>\n\n' + content -}}
{%- else -%}
{{- '<|im_start|>assistant\n' + content -}}
{%- endif -%}
{%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping -%}
{%- for call in message.tool_calls -%}
{%- set call = call.function if call.function is defined else call -%}
{%- if not loop.first -%}{{- '\n' -}}{%- elif content | trim -%}{{- '\n\n' -}}{%- endif -%}
{{- '<tool_call>\n<function=' + call.name + '>\n' -}}
{%- if call.arguments is defined and call.arguments is mapping -%}
{%- for name, value in call.arguments | items -%}
{{- '<parameter=' + name + '>\n' -}}
{{- value | tojson if value is mapping or (value is sequence and value is not string) else value | string -}}
{{- '\n</parameter>\n' -}}
{%- endfor -%}
{%- endif -%}
{{- '</function>\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- else -%}
{{- raise_exception('Unexpected message role.') -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{- '<think>\n\n</think>\n\n' -}}
{%- else -%}
{{- '<think>\n' -}}
{%- endif -%}
{%- endif -%}
"""

# A small bilingual corpus to train the byte-level BPE tokenizer on. Any text works; this keeps the
# vocabulary plausible for the prompts used in tests and examples.
TOKENIZER_CORPUS = """\
You are a helpful assistant. Describe this image in one sentence. What is in the picture?
Please calculate 23 x 47 step by step. The answer is 1081. Think carefully before answering.
The quick brown fox jumps over the lazy dog. A red square on a white background, a blue circle.
Hello, how are you today? I am fine, thank you. What is 2 + 3? It is 5. Count from one to ten.
Explain why the sky is blue. Light scatters in the atmosphere; shorter wavelengths scatter more.
请计算 23 × 47 = ?，写出详细步骤。请观察图片，分析这个物理现象的原因。你好，今天天气怎么样？
这是一张图片。图中有一个红色的正方形。请用一句话描述这张图片。谢谢！我们来一步一步地思考。
def add(a, b): return a + b  # Python code; numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2026
{"name": "get_weather", "arguments": {"city": "Beijing"}} <function=get_weather> </function>
<parameter=city> Paris </parameter> What is the weather in Paris? {"temperature": 21, "unit": "celsius"}
"""


@dataclasses.dataclass(frozen=True)
class Preset:
    """Shapes of one checkpoint preset. `full` mirrors the released MiniCPM-V 4.6 (docs/design/model.md,
    "Architecture and shapes")."""

    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int
    insert_layer_id: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_head_dim: int
    text_intermediate: int
    linear_key_heads: int
    linear_value_heads: int
    linear_head_dim: int
    vocab_size: int | None  # None: exactly the tokenizer's size
    tie_word_embeddings: bool
    output_scale: float  # multiplies the output layer's init: peaked next-token distributions


PRESETS = {
    # CPU kernels: linear-attention head dims must be 64 or 128; `insert_layer_id` must stay below
    # the vision layer count or HF and vLLM silently disagree (docs/design/model.md, "Vision path").
    "tiny": Preset(
        vision_hidden=64, vision_layers=3, vision_heads=2, vision_intermediate=128, insert_layer_id=1,
        text_hidden=64, text_layers=4, text_heads=2, text_kv_heads=1, text_head_dim=64,
        text_intermediate=128, linear_key_heads=2, linear_value_heads=2, linear_head_dim=64,
        vocab_size=None, tie_word_embeddings=False, output_scale=40.0,
    ),
    "full": Preset(
        vision_hidden=1152, vision_layers=27, vision_heads=16, vision_intermediate=4304, insert_layer_id=6,
        text_hidden=1024, text_layers=24, text_heads=8, text_kv_heads=2, text_head_dim=256,
        text_intermediate=3584, linear_key_heads=16, linear_value_heads=16, linear_head_dim=128,
        vocab_size=248094, tie_word_embeddings=True, output_scale=1.0,
    ),
}


# The full tokenizer's added tokens, from id 248044 on. Qwen3.5's come first, in Qwen3's order
# (Qwen3 has them from 151643; Qwen3.5 from 248044): released ids seen in public Qwen3.5 files are
# <|endoftext|> 248044 and <|im_end|> 248046 (this model's stop ids, docs/design/model.md),
# <|vision_start|> 248053, <|vision_end|> 248054, <|image_pad|> 248056, <|video_pad|> 248057
# (transformers' Qwen3_5Config defaults), <tool_call> 248058, </tool_call> 248059 (Qwen3.5's
# tokenizer_config.json) and <think> 248068 (a Qwen3.5 chat prompt's ids); the rest follow the order.
# MiniCPM-V's layout tokens and `<unk>` come after them (their released ids are not known here),
# then placeholders up to the 248,094 rows.
FULL_FIRST_ADDED_ID = 248044
QWEN35_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)


def _full_added_tokens(vocab_size: int) -> tuple[tuple[str, bool], ...]:
    qwen = {text for text, _ in QWEN35_ADDED_TOKENS}
    added = QWEN35_ADDED_TOKENS + tuple((t, sp) for t, sp in SPECIAL_TOKENS if t not in qwen)
    placeholders = vocab_size - FULL_FIRST_ADDED_ID - len(added)
    return added + tuple((f"<|reserved_{i}|>", True) for i in range(placeholders))


def _byte_level(text: str) -> str:
    """`text` as byte-level BPE spells it: one printable character per UTF-8 byte (GPT-2's map)."""
    alphabet = _byte_alphabet()
    return "".join(alphabet[b] for b in text.encode())


@functools.cache
def _byte_alphabet() -> tuple[str, ...]:
    """GPT-2's bytes-to-unicode map: byte b is spelled by alphabet[b]."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return tuple(spelled[b] for b in range(256))


def _full_regular_pieces(corpus_merges: list[tuple[str, str]]):
    """Text the full tokenizer's regular tokens spell, most plausible first (byte-level strings).

    The trained corpus merges first (the kit's own prompts tokenize as with the tiny tokenizer), then
    English-like pieces (letters with and without a leading space, capitalised), numbers, CJK and
    Hangul characters, punctuation pairs, and four-letter pieces in a fixed pseudo-random order to
    fill up. Any real text still tokenizes (every byte is a token); every token decodes to text.
    """
    import itertools
    import random
    import string

    for left, right in corpus_merges:
        yield left + right
    space = _byte_level(" ")
    letters = string.ascii_lowercase
    for n in (1, 2, 3):
        for chars in itertools.product(letters, repeat=n):
            word = "".join(chars)
            yield from (word, space + word, space + word.capitalize(), word.capitalize())
    for number in range(1000):
        yield from (str(number), space + str(number))
    for first, last in ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xAC00, 0xD7A3), (0x3040, 0x30FF)):
        for code in range(first, last + 1):
            yield _byte_level(chr(code))
    punctuation = [_byte_level(c) for c in string.punctuation]
    for a, b in itertools.product(punctuation, repeat=2):
        yield from (a + b, space + a + b)
    rng = random.Random(0)
    while True:
        yield space + "".join(rng.choice(letters) for _ in range(4))


def _full_bpe(regular: int):
    """A byte-level BPE model with exactly `regular` tokens (ids 0 .. regular-1): the 256 byte
    tokens, then a merge per piece of _full_regular_pieces (each piece built from its prefix and
    its last byte, so the merges are consistent)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.train_from_iterator(TOKENIZER_CORPUS.splitlines() * 4, trainer=trainers.BpeTrainer(
        vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    corpus_merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
                     for m in json.loads(trained.to_str())["model"]["merges"]]

    vocab = {token: i for i, token in enumerate(_byte_alphabet())}
    merges: list[tuple[str, str]] = []

    def add(token: str) -> None:
        if token in vocab or len(vocab) >= regular:
            return
        add(token[:-1])
        if len(vocab) < regular:
            merges.append((token[:-1], token[-1]))
            vocab[token] = len(vocab)

    for piece in _full_regular_pieces(corpus_merges):
        if len(vocab) >= regular:
            break
        add(piece)
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return bpe


def build_tokenizer(out_dir: pathlib.Path, vocab_size: int | None = None):
    """A deterministic byte-level BPE tokenizer, saved in `out_dir` and loaded back as a transformers
    tokenizer. `vocab_size` None: trained on TOKENIZER_CORPUS (tiny); else exactly that many tokens,
    the added ones from FULL_FIRST_ADDED_ID on (full)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size is None:
        specials = SPECIAL_TOKENS
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=1024,
            special_tokens=[text for text, _ in SPECIAL_TOKENS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        bpe.train_from_iterator(TOKENIZER_CORPUS.splitlines() * 4, trainer=trainer)
    else:
        specials = _full_added_tokens(vocab_size)
        bpe = _full_bpe(FULL_FIRST_ADDED_ID)
        bpe.add_special_tokens([text for text, _ in specials])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        extra_special_tokens=[text for text, special in specials if special],
        model_max_length=262144,
        **TOKENIZER_ROLE_TOKENS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    # Mark the thinking/tool markers non-special the way Qwen tokenizers do.
    path = out_dir / "tokenizer.json"
    data = json.loads(path.read_text())
    nonspecial = {text for text, special in specials if not special}
    for token in data["added_tokens"]:
        if token["content"] in nonspecial:
            token["special"] = False
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


def build_config(preset: Preset, tokenizer, model_type: str = DEFAULT_MODEL_TYPE):
    import transformers

    model = MODELS[model_type]

    ids = {text: tokenizer.convert_tokens_to_ids(text) for text, _ in SPECIAL_TOKENS}
    vocab = preset.vocab_size or len(tokenizer)
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (preset.text_layers // 4)
    text_config = {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": preset.text_hidden,
        "intermediate_size": preset.text_intermediate,
        "num_hidden_layers": preset.text_layers,
        "num_attention_heads": preset.text_heads,
        "num_key_value_heads": preset.text_kv_heads,
        "head_dim": preset.text_head_dim,
        "linear_num_key_heads": preset.linear_key_heads,
        "linear_num_value_heads": preset.linear_value_heads,
        "linear_key_head_dim": preset.linear_head_dim,
        "linear_value_head_dim": preset.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "layer_types": layer_types,
        "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "mamba_ssm_dtype": "float32",
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": preset.tie_word_embeddings,
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": "bfloat16",
    }
    canvas: dict = {}
    if model.canvas_mrope:  # 4.7 (vLLM's minicpmv4_7.py, transformers' get_rope_index)
        # Qwen3.5's interleaved M-RoPE over the rotary half of each head: the released 0.8B text
        # tower (head_dim 256, partial_rotary_factor 0.25) has 32 rotary pairs, [11, 11, 10].
        pairs = int(preset.text_head_dim * 0.25) // 2
        base, rest = divmod(pairs, 3)
        section = [base + (rest > 0), base + (rest > 1), base]
        text_config["rope_parameters"] |= {"mrope_section": section, "mrope_interleaved": True}
        newline = tokenizer.encode("\n", add_special_tokens=False)
        canvas = {"image_start_id": ids["<image>"], "image_end_id": ids["</image>"],
                  "slice_start_id": ids["<slice>"], "slice_end_id": ids["</slice>"],
                  "newline_id": newline[0],
                  # What vLLM reads to place image tokens on the canvas (`_init_canvas_mrope`);
                  # transformers always does. Without it vLLM falls back to sequential positions.
                  "mrope_mode": "canvas"}
    vision_config = {
        "hidden_size": preset.vision_hidden,
        "intermediate_size": preset.vision_intermediate,
        "num_hidden_layers": preset.vision_layers,
        "num_attention_heads": preset.vision_heads,
        "image_size": 980,
        "patch_size": 14,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    }
    return getattr(transformers, model.transformers_config)(
        text_config=text_config,
        vision_config=vision_config,
        insert_layer_id=preset.insert_layer_id,
        image_size=448,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=preset.tie_word_embeddings,
        downsample_mode="16x",
        architectures=[model.architecture],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        dtype="bfloat16",
        **canvas,
    )


def build_model(config, preset: Preset, seed: int):
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config)
    with torch.no_grad():
        # Norm weights of Qwen3.5 are stored as offsets from 1 and default to zeros; a small random
        # perturbation of every parameter makes each one matter, so a corrupted or skipped tensor
        # shows up in parity checks.
        generator = torch.Generator().manual_seed(seed + 1)
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
        model.lm_head.weight.mul_(preset.output_scale)
    return model.to(torch.bfloat16)


def save_processor(out_dir: pathlib.Path, tokenizer, model_type: str = DEFAULT_MODEL_TYPE) -> None:
    import transformers

    # The released model's defaults: 448 px base resolution, up to 9 slices, 16x downsampling. 4.7
    # keeps 4.6's image and video processors (transformers' auto mappings name them for minicpmv4_7).
    processor_class, image_class, video_class = MODELS[model_type].processor_classes
    processor = getattr(transformers, processor_class)(
        image_processor=getattr(transformers, image_class)(),
        video_processor=getattr(transformers, video_class)(),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)


def write_generation_config(out_dir: pathlib.Path, tokenizer) -> None:
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    config = {
        "eos_token_id": stops,
        "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")


README_TEXT = """# Random-weight {name} checkpoint ({preset})

Generated by `minicpmv-make-checkpoint --model {model_type} --preset {preset} --seed {seed}`.
The weights are RANDOM: every answer this model gives is noise. It has the released model's
architecture and parameter names so that the serving stack can be exercised without the real
weights. To serve the real model, point MODEL_PATH at a download of {modelscope_id}.
"""


def generate(out_dir: pathlib.Path, preset_name: str = "tiny", seed: int = 0,
             model_type: str = DEFAULT_MODEL_TYPE) -> pathlib.Path:
    """Write the checkpoint into `out_dir` (created; existing files are overwritten)."""
    preset, model = PRESETS[preset_name], MODELS[model_type]
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir, preset.vocab_size)
    config = build_config(preset, tokenizer, model_type)
    build_model(config, preset, seed).save_pretrained(out_dir)
    save_processor(out_dir, tokenizer, model_type)
    write_generation_config(out_dir, tokenizer)
    (out_dir / "README.md").write_text(README_TEXT.format(
        name=model.name, model_type=model_type, preset=preset_name, seed=seed, modelscope_id=model.modelscope_id))
    for path in out_dir.iterdir():  # safetensors writes 0600: a non-root server could not read it
        path.chmod(0o644)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=pathlib.Path, help="directory to write the checkpoint into")
    parser.add_argument("--model", choices=list(MODELS), default=DEFAULT_MODEL_TYPE,
                        help="which MiniCPM-V (its config.json model_type; default %(default)s)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    generate(args.out_dir, args.preset, args.seed, args.model)
    print(f"wrote random-weight {MODELS[args.model].name} ({args.preset}, seed {args.seed}) to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
