"""The random-weight checkpoint generator: loadable by HF with no missing or unexpected weights,
deterministic, peaked, released-model shapes for `full`, and a chat template that thinks by default."""

from __future__ import annotations

import hashlib
import json
import pathlib

import pytest

from minicpmv_ascend import checkpoint


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_hf_loads_tiny_checkpoint_with_no_missing_or_unexpected_weights(tiny_checkpoint):
    import torch
    from transformers import MiniCPMV4_6ForConditionalGeneration

    model, info = MiniCPMV4_6ForConditionalGeneration.from_pretrained(
        tiny_checkpoint, output_loading_info=True, dtype=torch.float32
    )
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    # The names are the released model's: vision tower, its window merger, the merger MLP, the LM.
    names = {name for name, _ in model.named_parameters()}
    for prefix in ("model.vision_tower.encoder.layers.0.", "model.vision_tower.vit_merger.",
                   "model.merger.", "model.language_model.layers.0.linear_attn.",
                   "model.language_model.layers.3.self_attn.", "lm_head."):
        assert any(name.startswith(prefix) for name in names), prefix


@pytest.mark.slow
def test_generation_is_deterministic_by_seed(tiny_checkpoint, tmp_path):
    again = checkpoint.generate(tmp_path / "same", "tiny", seed=0)
    other = checkpoint.generate(tmp_path / "other", "tiny", seed=1)
    weights = "model.safetensors"
    assert sha256(again / weights) == sha256(tiny_checkpoint / weights)
    assert sha256(other / weights) != sha256(tiny_checkpoint / weights)
    for name in ("config.json", "tokenizer.json", "processor_config.json", "generation_config.json"):
        assert (again / name).read_text() == (tiny_checkpoint / name).read_text(), name


@pytest.mark.slow
def test_tiny_model_next_token_distribution_is_peaked(tiny_checkpoint):
    """Accuracy checks need confident tokens: the top-1/top-2 log-prob gap must be large."""
    import torch
    from transformers import AutoProcessor, MiniCPMV4_6ForConditionalGeneration

    model = MiniCPMV4_6ForConditionalGeneration.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(tiny_checkpoint)
    ids = processor.tokenizer("Please calculate 23 x 47 step by step.", return_tensors="pt").input_ids
    with torch.no_grad():
        logprobs = model(input_ids=ids).logits.log_softmax(-1)[0]
    top2 = logprobs.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    assert gaps.median() > 0.5, f"median top-1/top-2 gap {gaps.median():.3f} nat: not peaked"


@pytest.mark.slow
def test_tiny_config_is_the_tiny_checkpoint_without_its_weights(tiny_config, tiny_checkpoint):
    """The unit tests' stand-in (tests/conftest.py `tiny_config`) holds the real checkpoint's files
    byte for byte, all but the weights."""
    names = {p.name for p in tiny_checkpoint.iterdir()} - {"model.safetensors", "README.md"}
    assert {p.name for p in tiny_config.iterdir()} == names | {"model.safetensors"}
    for name in names:
        assert (tiny_config / name).read_bytes() == (tiny_checkpoint / name).read_bytes(), name


@pytest.mark.slow  # imports torch and transformers' model code in this process: ~10 s of CPU where nothing had
def test_full_preset_has_the_released_model_shapes(tmp_path):
    """Built on the meta device (no memory; the time is torch's and transformers' imports): ~1.3B parameters, the shapes of docs/design/model.md, "Architecture and shapes"."""
    import torch
    from transformers import MiniCPMV4_6ForConditionalGeneration

    tokenizer = checkpoint.build_tokenizer(tmp_path)
    config = checkpoint.build_config(checkpoint.PRESETS["full"], tokenizer)
    with torch.device("meta"):
        model = MiniCPMV4_6ForConditionalGeneration(config)
    params = dict(model.named_parameters())
    assert 1.25e9 < sum(p.numel() for p in params.values()) < 1.35e9
    assert params["model.language_model.embed_tokens.weight"].shape == (248094, 1024)
    assert params["model.vision_tower.encoder.layers.26.self_attn.q_proj.weight"].shape == (1152, 1152)
    assert "model.vision_tower.encoder.layers.27.self_attn.q_proj.weight" not in params
    text = config.text_config
    assert (text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (24, 8, 2, 256)
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"] + text.layer_types[4:]
    assert text.layer_types.count("full_attention") == 6
    assert text.rope_parameters["partial_rotary_factor"] == 0.25
    assert "mrope_section" not in text.rope_parameters  # the released config has plain RoPE


@pytest.mark.slow  # 4-12 s of CPU building 248,094 tokens: make test, not the fast loop
def test_full_preset_tokenizer_has_the_released_vocabulary_and_ids(tmp_path):
    """The full preset's tokenizer (built alone, no weights): 248,094 tokens like the output matrix,
    the released special-token ids where known, and every id the model can sample decodes to text
    (with 731 tokens for 248,094 rows, almost every sampled id decoded to nothing)."""
    import random

    full = checkpoint.PRESETS["full"]
    tokenizer = checkpoint.build_tokenizer(tmp_path, full.vocab_size)
    assert len(tokenizer) == full.vocab_size == 248094
    released = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<|vision_start|>": 248053,
                "<|vision_end|>": 248054, "<|image_pad|>": 248056, "<|video_pad|>": 248057, "<tool_call>": 248058,
                "</tool_call>": 248059, "<think>": 248068}
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in released} == released
    # Every marker the template, the processor and the parsers use is one token, special or not as in Qwen.
    for text, special in checkpoint.SPECIAL_TOKENS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == ("" if special else text), text

    sampled = random.Random(0).sample(range(len(tokenizer)), 3000)
    empty = [i for i in sampled if not tokenizer.decode([i])]
    assert not empty, f"{len(empty)} of 3000 ids decode to nothing, e.g. {empty[:5]}"
    regular = [i for i in sampled if i < checkpoint.FULL_FIRST_ADDED_ID]
    assert sum(1 for i in regular if tokenizer.decode([i]).strip()) > 0.9 * len(regular)
    for text in ("Please calculate 23 x 47 step by step.", "请观察图片，分析这个物理现象的原因。", "x = {'a': [1, 2]} # ok"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text and len(ids) < len(text.encode()), text

    config = checkpoint.build_config(full, tokenizer)
    assert config.text_config.vocab_size == len(tokenizer)
    assert (config.image_token_id, config.video_token_id, config.eos_token_id) == (248056, 248057, 248046)


def test_chat_template_thinks_by_default_and_can_be_turned_off(tiny_config):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_config)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]
    on = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    off = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<think>\n\n</think>\n\n")
    assert "<|image_pad|>Describe." in on


def test_generation_config_stops_on_im_end(tiny_config):
    from transformers import AutoProcessor

    tokenizer = AutoProcessor.from_pretrained(tiny_config).tokenizer
    stops = json.loads((tiny_config / "generation_config.json").read_text())["eos_token_id"]
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in stops


@pytest.mark.parametrize("token", ["<think>", "</think>", "<|image_pad|>", "<slice>", "<image_id>", "<tool_call>",
                                   "</tool_call>", "<tool_response>", "</tool_response>"])
def test_special_tokens_are_single_tokens(tiny_config, token):
    from transformers import AutoProcessor

    tokenizer = AutoProcessor.from_pretrained(tiny_config).tokenizer
    assert len(tokenizer(token, add_special_tokens=False).input_ids) == 1


def test_chat_template_renders_tools_calls_and_results_in_qwen3_coder_format(tiny_config):
    """Tools in the system turn, an assistant call exactly as vLLM's qwen3_coder parser reads it
    (the format tests/test_tool_parsing.py feeds the parser), results as <tool_response> in a user
    turn, the thinking of the current tool loop kept, older thinking dropped."""
    from transformers import AutoProcessor

    import tool_parsing_harness as harness

    tokenizer = AutoProcessor.from_pretrained(tiny_config).tokenizer
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "options": {"unit": "celsius"}}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>old</think>\n\nHello."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "I need the tool.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 21}'},
    ]
    text = tokenizer.apply_chat_template(messages, tools=harness.TOOLS, add_generation_prompt=True, tokenize=False)
    system = text[:text.index("<|im_end|>")]
    assert system.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    assert json.dumps(harness.TOOLS[0]) in system and system.endswith("</IMPORTANT>\n\nBe brief.")
    expected_call = harness.call_text("get_weather", city="Paris", options={"unit": "celsius"})
    assert f"<|im_start|>assistant\n<think>\nI need the tool.\n</think>\n\n{expected_call}<|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response><|im_end|>\n" in text
    assert "<|im_start|>assistant\nHello.<|im_end|>" in text and "old" not in text
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    without_tools = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False)
    assert without_tools.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "# Tools" not in without_tools


def test_an_unfinished_thought_continues_the_generation_prompt(tiny_config):
    """`continue_final_message` with an assistant message `<think>\\n...` (how the parity tool
    teacher-forces a reasoning continuation) renders the generation prompt, then the text."""
    from transformers import AutoProcessor

    tokenizer = AutoProcessor.from_pretrained(tiny_config).tokenizer
    user = [{"role": "user", "content": "What is 2+3?"}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    continued = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": "<think>\nTwo plus three "}],
                                              continue_final_message=True, tokenize=False)
    assert continued == prompt + "Two plus three "
