"""Serve a small random-weight model with transformers' continuous batching on our ops.

    python examples/serve_transformers.py                       # CPU: a Llama-like model, f32
    python examples/serve_transformers.py --device cuda --dtype bfloat16 --requests 32 \\
        --size medium --check --compare "paged|sdpa" sdpa       # GPU: beside transformers' own

Half the requests arrive first; the rest arrive once the first ones decode, so every step mixes
prefill chunks and decodes of ragged lengths. Prints, per attention implementation, the tokens per
second (generated tokens over the wall time from the first request to the last result). A
compared name with "paged|" runs the same continuous batching; one without (sdpa, eager) runs
transformers' plain `generate` on the whole batch at once, left-padded. --check also prints, per
implementation, on how many steps its token equals the one transformers' eager attention picks
given the same history (teacher-forced: one eager forward over each request's prompt and tokens),
the widest eager top-1 margin among the steps that differ, in units in the last place of the
logits (ties at the dtype's resolution may go either way; a wrong kernel differs at wide margins) and how many requests are equal throughout.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import xla_gpu_ops.transformers as xgo_transformers

FAMILIES = {  # family -> (config class, model class, config arguments)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "sliding_window": 128,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
}


SIZES = {  # size -> (hidden, intermediate, query heads, KV heads, head dim, layers)
    "small": (512, 1024, 8, 2, 64, 2),  # CPU
    "medium": (2048, 5632, 16, 4, 128, 8),  # a GPU: Llama-like heads, ~0.6B parameters
}


def build_model(family: str, device: str, dtype: torch.dtype, size: str, seed: int = 0):
    config_name, model_name, extra = FAMILIES[family]
    hidden, intermediate, heads, kv_heads, head_dim, layers = SIZES[size]
    config = getattr(transformers, config_name)(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        initializer_range=0.1,
        **extra,
    )
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(config).eval().to(device=device, dtype=dtype)


def make_prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 200, (count,), generator=generator).tolist()
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def serve(model, attn: str, prompts: list[list[int]], new_tokens: int, block_size: int = 32):
    """Runs the prompts through a continuous-batching manager, the second half arriving once the
    first request has a token. Returns ({request: tokens}, seconds)."""
    model.set_attn_implementation(attn)
    manager = model.init_continuous_batching(
        generation_config=transformers.GenerationConfig(
            max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        ),
        continuous_batching_config=transformers.ContinuousBatchingConfig(
            block_size=block_size, max_batch_tokens=512, use_cuda_graph=False
        ),
    )
    manager.start()
    half = (len(prompts) + 1) // 2
    start = time.perf_counter()
    for i in range(half):
        manager.add_request(prompts[i], request_id=f"r{i}", streaming=i == 0)
    first = manager.get_result(request_id="r0", timeout=600)  # the first decode has happened
    if first is None:
        manager.stop(block=True)
        raise RuntimeError(f"{attn}: no token came back for the first request")
    for i in range(half, len(prompts)):
        manager.add_request(prompts[i], request_id=f"r{i}")
    done: dict[str, list[int]] = {}
    while len(done) < len(prompts):
        result = manager.get_result(timeout=600)
        if result is None:
            manager.stop(block=True)
            raise RuntimeError(f"{attn}: stopped with {len(done)} of {len(prompts)} requests done")
        if result.is_finished():
            done[result.request_id] = result.generated_tokens
    seconds = time.perf_counter() - start
    manager.stop(block=True)
    return {i: done[f"r{i}"] for i in range(len(prompts))}, seconds


def generate_batch_at_once(model, attn: str, prompts: list[list[int]], new_tokens: int):
    """transformers' plain generate with `attn` over every prompt at once, left-padded: the
    static-batch baseline. Returns ({request: tokens}, seconds)."""
    model.set_attn_implementation(attn)
    longest = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, longest - len(prompt) :] = torch.tensor(prompt)
        mask[i, longest - len(prompt) :] = 1
    config = transformers.GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    start = time.perf_counter()
    out = model.generate(
        ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config
    )
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {i: out[i, longest:].tolist() for i in range(len(prompts))}, seconds


def eager_step_match(model, prompts: list[list[int]], tokens: dict[int, list[int]]):
    """Teacher-forced comparison with eager attention: for each request, one eager forward over its
    prompt and its generated tokens; at each step, the token eager picks from the same history.
    Returns (equal steps, requests equal at every step, the widest eager top-1 margin among the
    steps that differ, in units of the model dtype's spacing at that logit)."""
    model.set_attn_implementation("eager")
    equal = requests = 0
    widest = 0.0
    for i, prompt in enumerate(prompts):
        generated = torch.tensor(tokens[i])
        ids = torch.tensor([prompt + tokens[i][:-1]], device=model.device)
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 :].float().cpu()
        same = logits.argmax(-1) == generated
        equal += int(same.sum())
        requests += bool(same.all())
        if not same.all():
            top2 = logits.topk(2, dim=-1).values
            # the spacing of the model dtype's numbers at the top logit (its unit in the last place)
            spacing = torch.finfo(model.dtype).eps * torch.exp2(top2[:, 0].abs().log2().floor())
            widest = max(widest, float(((top2[:, 0] - top2[:, 1]) / spacing)[~same].max()))
    return equal, requests, widest


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--compare", nargs="*", default=[], help="other attn_implementations")
    parser.add_argument("--check", action="store_true", help="compare tokens with eager attention")
    args = parser.parse_args(argv)

    model = build_model(args.family, args.device, getattr(torch, args.dtype), args.size)
    prompts = make_prompts(args.requests, model.config.vocab_size, seed=1)
    report = {}
    for attn in [xgo_transformers.register(), *args.compare]:
        if "paged|" in attn:
            tokens, seconds = serve(model, attn, prompts, args.new_tokens)
            name = attn
        else:
            tokens, seconds = generate_batch_at_once(model, attn, prompts, args.new_tokens)
            name = f"generate({attn})"
        generated = sum(len(t) for t in tokens.values())
        line = f"{name:>20}: {generated} tokens in {seconds:.2f} s, {generated / seconds:.1f} tok/s"
        steps = matching = widest = None
        if args.check:
            steps, matching, widest = eager_step_match(model, prompts, tokens)
            line += (
                f"; steps equal to eager given the same history: {steps}/{generated} "
                f"({100 * steps / generated:.2f} %), widest eager margin among the others "
                f"{widest:.1f} ulp; {matching}/{len(tokens)} requests equal throughout"
            )
        print(line, flush=True)
        report[attn] = {
            "tokens": tokens,
            "seconds": seconds,
            "equal_steps": steps,
            "matching": matching,
            "widest_margin_differing": widest,
        }
    return report


if __name__ == "__main__":
    main()
