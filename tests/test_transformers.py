"""xla_gpu_ops.transformers: transformers' continuous batching with every attention call and cache
write through our ops, on random-weight models made from configs (no download). Greedy tokens in
float32 must equal transformers' own eager attention, request by request; and dropping a feature
the model relies on (the window, the soft cap, the sinks) must change them, so the comparison can
tell."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
xt = pytest.importorskip("xla_gpu_ops.transformers")

from xla_gpu_ops import _library  # noqa: E402

needs_library = pytest.mark.skipif(not _library.is_built(), reason="libxla_gpu_ops.so is not built")
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
]
VOCAB = 256
WINDOW = 8  # sliding layers' window: shorter than most prompts below
# Ragged prompts: a 40-token one is prefilled in two chunks (max_batch_tokens 32), the others
# arrive beside it and decode while it is still prefilling.
PROMPT_LENS = (5, 2, 40, 17, 1)
NEW_TOKENS = 10
_COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 512,
}
# family -> (config class, model class, config arguments); initializer ranges where the random
# model's greedy tokens vary from step to step
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"initializer_range": 0.1}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"initializer_range": 0.1}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "initializer_range": 0.02,
            "sliding_window": WINDOW,
            # scaling 1 and a cap of 1: the logits pass the cap, so the cap changes the tokens
            "attn_logit_softcapping": 1.0,
            "query_pre_attn_scalar": 1,
        },
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "initializer_range": 0.1,
            "sliding_window": WINDOW,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
}


def make_model(family: str, device: str):
    config_name, model_name, extra = MODELS[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**_COMMON, **extra)
    model = getattr(transformers, model_name)(config).eval().to(device)
    if family == "gpt_oss":  # sinks start at zero; make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def generation_config():
    return transformers.GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
    )


def eager_tokens(model, device: str) -> list[list[int]]:
    model.set_attn_implementation("eager")
    out = []
    for prompt in prompts():
        ids = torch.tensor([prompt], device=device)
        out.append(model.generate(ids, generation_config=generation_config())[0, len(prompt) :])
    return [t.tolist() for t in out]


def batch_tokens(model) -> list[list[int]]:
    model.set_attn_implementation(xt.register())
    config = transformers.ContinuousBatchingConfig(
        block_size=16, num_blocks=64, max_batch_tokens=32, use_cuda_graph=False
    )
    out = model.generate_batch(
        inputs=prompts(), generation_config=generation_config(), continuous_batching_config=config
    )
    return [out[f"req_{i}"].generated_tokens for i in range(len(PROMPT_LENS))]


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of our two ops made by the attention function."""
    counts = {"paged_attention": 0, "kv_cache_store": 0}
    for name in counts:
        attr = f"_{name}"
        original = getattr(xt, attr)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(xt, attr, counted)
    return counts


@needs_library
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(MODELS))
def test_generate_batch_matches_eager(family, device, calls):
    model = make_model(family, device)
    expected = eager_tokens(model, device)
    got = batch_tokens(model)
    assert got == expected
    assert all(len(tokens) == NEW_TOKENS for tokens in got)
    # every layer of every forward step went through our ops, writes and reads alike
    assert calls["paged_attention"] == calls["kv_cache_store"] > 0
    assert calls["paged_attention"] % model.config.num_hidden_layers == 0


# family -> the keyword of paged_attention a feature of that model rides on
DROPPED = {"gemma2": ("soft_cap", "sliding_window"), "gpt_oss": ("sinks", "sliding_window")}


@needs_library
@pytest.mark.parametrize(
    ("family", "dropped"), [(f, d) for f, features in DROPPED.items() for d in features]
)
def test_dropping_a_feature_changes_the_tokens(family, dropped, monkeypatch):
    """The comparison above can fail: without the feature, the same run gives other tokens."""
    original = xt._paged_attention

    def without(*args, **kwargs):
        kwargs[dropped] = None
        return original(*args, **kwargs)

    model = make_model(family, "cpu")
    expected = eager_tokens(model, "cpu")
    monkeypatch.setattr(xt, "_paged_attention", without)
    assert batch_tokens(model) != expected


@needs_library
def test_generate_with_a_paged_cache_goes_through_our_ops(calls):
    model = make_model("llama", "cpu")
    (prompt,) = prompts()[:1]
    expected = eager_tokens(model, "cpu")[0]
    model.set_attn_implementation(xt.register())
    out = model.generate(
        torch.tensor([prompt]),
        generation_config=generation_config(),
        cache_implementation="paged",
        continuous_batching_config=transformers.ContinuousBatchingConfig(
            block_size=16, num_blocks=16, max_batch_tokens=32, use_cuda_graph=False
        ),
    )
    # generate hands continuous batching's sequences back as [1, requests, prompt + new tokens]
    assert out[0, 0, len(prompt) :].tolist() == expected
    assert calls["paged_attention"] > 0


@needs_library
def test_a_forward_without_a_paged_cache_says_what_to_use():
    model = make_model("llama", "cpu")
    model.set_attn_implementation(xt.register())
    with pytest.raises(ValueError, match="cache_implementation='paged'"):
        model(torch.tensor([[1, 2, 3]]))


@needs_library
def test_a_model_with_only_sliding_layers_is_refused(caplog):
    torch.manual_seed(0)
    config = transformers.MistralConfig(**_COMMON, sliding_window=WINDOW)
    model = transformers.MistralForCausalLM(config).eval()
    model.set_attn_implementation(xt.register())
    out = model.generate_batch(
        inputs=prompts()[:1],
        generation_config=generation_config(),
        continuous_batching_config=transformers.ContinuousBatchingConfig(
            block_size=16, num_blocks=16, max_batch_tokens=32, use_cuda_graph=False
        ),
    )
    assert not out.get("req_0") or not out["req_0"].generated_tokens
    assert "needs at least one full-attention layer" in caplog.text


@needs_library
def test_serving_example_runs_ragged_arrivals_and_matches_eager():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "serve_transformers.py"
    spec = importlib.util.spec_from_file_location("serve_transformers_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    report = example.main(["--device", "cpu", "--requests", "4", "--new-tokens", "6", "--check"])
    (result,) = report.values()
    assert result["equal_steps"] == 4 * 6, "f32: eager picks every token ours picked"
    assert result["matching"] == 4
    assert all(len(tokens) == 6 for tokens in result["tokens"].values())
