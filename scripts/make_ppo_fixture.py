#!/usr/bin/env python3
"""PPO's loss and its gradient as CleanRL's ppo.py computes them (PyTorch's
autograd), for tests/test_rl_ppo.c: random logits, values, actions, the
rollout's log probabilities (some ratios beyond the clip range both ways),
advantages already normalised, returns and old values (some value updates
beyond the clip range), with the value loss clipped and not.

    scripts/make_ppo_fixture.py tests/fixtures/ppo_loss.bin"""
import sys

import torch
from torch.distributions.categorical import Categorical

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import fixture_arrays  # noqa: E402

B, K = 48, 3
CLIP, ENT, VF = 0.2, 0.01, 0.5


def case(g, clip_vloss):
    logits = torch.randn(B, K, generator=g, dtype=torch.float64) * 1.5
    values = torch.randn(B, generator=g, dtype=torch.float64) * 2
    actions = torch.randint(0, K, (B,), generator=g)
    dist = Categorical(logits=logits)
    old_logp = dist.log_prob(actions) + torch.randn(B, generator=g, dtype=torch.float64) * 0.15
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    old_values = values + torch.randn(B, generator=g, dtype=torch.float64) * 0.2
    returns = torch.randn(B, generator=g, dtype=torch.float64) * 2
    # what the test gives dtrain, in float32; the loss from those same values
    inputs = [t.float().double() for t in (logits, values, old_logp, adv, old_values, returns)]
    logits, values, old_logp, adv, old_values, returns = inputs
    logits.requires_grad_(True)
    values.requires_grad_(True)
    # ppo.py's update, one minibatch
    newlogprob = Categorical(logits=logits).log_prob(actions)
    entropy = Categorical(logits=logits).entropy()
    logratio = newlogprob - old_logp
    ratio = logratio.exp()
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    if clip_vloss:
        v_loss_unclipped = (values - returns) ** 2
        v_clipped = old_values + torch.clamp(values - old_values, -CLIP, CLIP)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((values - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - ENT * entropy_loss + v_loss * VF
    loss.backward()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > CLIP).float().mean()
    clipped = int(((ratio - 1).abs() > CLIP).sum())
    print(f"clip_vloss {clip_vloss}: {clipped} of {B} ratios clipped, loss {loss.item():.6f}")
    pre = f"v{clip_vloss}."
    return [(pre + "logits", logits), (pre + "values", values), (pre + "actions", actions.double()), (pre + "old_logp", old_logp),
            (pre + "adv", adv), (pre + "old_values", old_values), (pre + "returns", returns),
            (pre + "terms", torch.stack([loss, pg_loss, v_loss, entropy_loss, approx_kl, clipfrac]).detach()),
            (pre + "dlogits", logits.grad), (pre + "dvalues", values.grad)]


def main():
    g = torch.Generator().manual_seed(5)
    records = case(g, 1) + case(g, 0)
    fixture_arrays.write(sys.argv[1], [(n, t.detach().float()) for n, t in records])


if __name__ == "__main__":
    main()
