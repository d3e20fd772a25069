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
import torch.nn.functional as F
from torch_gpt_model import GPT


def train(args):
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = args.mode == "tf32"
    torch.backends.cudnn.allow_tf32 = args.mode == "tf32"
    model = GPT(12, 12, 768, 50304, 1024).to(dev)
    for p in model.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)

    def loss_of(x, y):  # the loss inside what is compiled, as the model's last op
        logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))

    step_fn = torch.compile(loss_of) if args.compile else loss_of
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
