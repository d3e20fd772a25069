"""PyTorch's GPT-2 training step on a GPU, the baseline for dtrain's (bench/gpu_check.sh): the same model as
dtrain's preset (GPT-2 124M: 12 layers, 12 heads, 768 channels, vocabulary 50257 padded to 50304, tied head, learned
positions), random tokens at B x T, AdamW (fused), in one of three modes: bf16 (autocast, torch.compile), f32 and
tf32 (no autocast, eager or compiled). Prints tokens/s and model FLOPs per second (dtrain's count: 6 N + 12 L T C a
token) against the same ceilings dtrain's bench measures. Then, with --decode, Hugging Face's generate at batch 1 and
32 on the same device (random weights, greedy, 128 new tokens).
usage: python3 torch_gpt2_gpu.py --mode bf16 --batch 16 --seq 1024 --steps 10 [--compile] [--decode]"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, NH=12, C=768, V=50304, T=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def train(args):
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = args.mode == "tf32"
    torch.backends.cudnn.allow_tf32 = args.mode == "tf32"
    model = GPT().to(dev)
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randint(0, 50257, (args.batch, args.seq), device=dev, generator=g)
    y = torch.randint(0, 50257, (args.batch, args.seq), device=dev, generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.mode == "bf16"):
            loss = step_fn(x, y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.time()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    t0 = time.time()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    sec = (time.time() - t0) / args.steps
    tps = args.batch * args.seq / sec
    fpt = 6 * n + 12 * 12 * args.seq * 768
    print(f"torch {torch.__version__} {args.mode}{' compiled' if args.compile else ' eager'} B {args.batch} T {args.seq}: "
          f"{sec * 1e3:.1f} ms a step, {tps:.0f} tokens/s, {fpt * tps / 1e12:.1f} TFLOP/s of model FLOPs; loss {loss.item():.4f}; "
          f"warm-up {warm:.0f} s; {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB peak", flush=True)


def decode():
    from transformers import GPT2Config, GPT2LMHeadModel
    dev = torch.device("cuda")
    model = GPT2LMHeadModel(GPT2Config()).to(dev).eval()
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        for batch in (1, 32):
            prompt = torch.randint(0, 50257, (batch, 16), device=dev)
            kw = dict(max_new_tokens=128, min_new_tokens=128, do_sample=False, pad_token_id=0)
            model.generate(prompt, **kw)
            torch.cuda.synchronize()
            t0 = time.time()
            model.generate(prompt, **kw)
            torch.cuda.synchronize()
            sec = time.time() - t0
            print(f"HF generate {str(dtype).split('.')[-1]} batch {batch}: {batch * 128 / sec:.0f} new tokens/s "
                  f"({sec * 1e3 / 128:.2f} ms a step)", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["bf16", "f32", "tf32"], default="bf16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--decode", action="store_true")
    args = ap.parse_args()
    if args.decode:
        decode()
    else:
        train(args)
