"""The GPT the PyTorch baselines train (bench/torch_second_order.py, bench/torch_gpt2_gpu.py): dtrain's GPT-2 family
block (pre-LayerNorm, fused q/k/v, causal attention, a tanh-GELU MLP four times as wide, every Linear with a bias),
learned positions, the head tied to the token table as a plain matmul; its Linears are nn.Linear, so kfac-pytorch
registers them. forward(idx) gives the logits."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, channels, vocab, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, channels), nn.Embedding(seq, channels)
        self.blocks = nn.ModuleList(Block(channels, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(channels)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.lnf(x) @ self.wte.weight.t()
