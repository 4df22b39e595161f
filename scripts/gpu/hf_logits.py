"""The transformers reference for the GPU model path's correctness test.

Writes into DIR a random Llama (head dim 128, GQA 4, vocab 2048, weights rounded to bf16
values; saved with save_pretrained as f32 safetensors, so our loader reads a directory made by transformers itself), ids.json
(prompts of several lengths) and the logits of each prompt's last position computed by
transformers on the GPU in f32 (hf_logits_f32.json) and in bf16 (hf_logits_bf16.json).

    python3 scripts/gpu/hf_logits.py DIR
"""
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main(out):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=2048,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Weights exactly representable in bf16: a bf16 run then differs from the f32 reference
    # only by its arithmetic, not by rounding the weights.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    model.save_pretrained(out, safe_serialization=True)
    g = torch.Generator().manual_seed(1)
    lengths = [1, 17, 200, 700]
    ids = [torch.randint(4, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    json.dump(ids, open(f"{out}/ids.json", "w"))
    for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        m = model.to(device="cuda", dtype=dtype)
        rows = []
        with torch.no_grad():
            for seq in ids:
                x = torch.tensor([seq], device="cuda")
                logits = m(x).logits[0, -1].float().cpu().tolist()
                rows.append(logits)
        json.dump(rows, open(f"{out}/hf_logits_{name}.json", "w"))
    print(f"wrote the transformers reference into {out}: prompts of {lengths} tokens")


if __name__ == "__main__":
    main(sys.argv[1])
