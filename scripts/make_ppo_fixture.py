#!/usr/bin/env python3
"""PPO's loss and its gradient as CleanRL's ppo.py computes them (PyTorch's
autograd), for tests/test_rl_ppo.c: random logits, values, actions, the
rollout's log probabilities (some ratios beyond the clip range both ways),
advantages already normalised, returns and old values (some value updates
beyond the clip range), with the value loss clipped and not; then the same
for ppo_continuous_action.py's Gaussian policy (means, a log std a
dimension, actions of two dimensions), with an entropy bonus.

    scripts/make_ppo_fixture.py tests/fixtures/ppo_loss.bin"""
import sys

import torch
from torch.distributions.categorical import Categorical
from torch.distributions.normal import Normal

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


def gaussian_case(g, dims=2):
    mean = torch.randn(B, dims, generator=g, dtype=torch.float64)
    logstd = torch.randn(1, dims, generator=g, dtype=torch.float64) * 0.5
    values = torch.randn(B, generator=g, dtype=torch.float64) * 2
    actions = mean + logstd.exp() * torch.randn(B, dims, generator=g, dtype=torch.float64)
    old_logp = Normal(mean, logstd.exp()).log_prob(actions).sum(1) + torch.randn(B, generator=g, dtype=torch.float64) * 0.15
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    old_values = values + torch.randn(B, generator=g, dtype=torch.float64) * 0.2
    returns = torch.randn(B, generator=g, dtype=torch.float64) * 2
    inputs = [t.float().double() for t in (mean, logstd, values, actions, old_logp, adv, old_values, returns)]
    mean, logstd, values, actions, old_logp, adv, old_values, returns = inputs
    for t in (mean, logstd, values):
        t.requires_grad_(True)
    # ppo_continuous_action.py's Agent.get_action_and_value and update, one minibatch
    std = logstd.expand_as(mean).exp()
    dist = Normal(mean, std)
    newlogprob = dist.log_prob(actions).sum(1)
    entropy = dist.entropy().sum(1)
    logratio = newlogprob - old_logp
    ratio = logratio.exp()
    pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)).mean()
    v_clipped = old_values + torch.clamp(values - old_values, -CLIP, CLIP)
    v_loss = 0.5 * torch.max((values - returns) ** 2, (v_clipped - returns) ** 2).mean()
    loss = pg_loss - ENT * entropy.mean() + v_loss * VF
    loss.backward()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > CLIP).float().mean()
    print(f"gaussian: {int(((ratio - 1).abs() > CLIP).sum())} of {B} ratios clipped, loss {loss.item():.6f}")
    return [("g.mean", mean), ("g.logstd", logstd), ("g.values", values), ("g.actions", actions), ("g.old_logp", old_logp),
            ("g.adv", adv), ("g.old_values", old_values), ("g.returns", returns),
            ("g.terms", torch.stack([loss, pg_loss, v_loss, entropy.mean(), approx_kl, clipfrac]).detach()),
            ("g.dmean", mean.grad), ("g.dlogstd", logstd.grad), ("g.dvalues", values.grad)]


def main():
    g = torch.Generator().manual_seed(5)
    records = case(g, 1) + case(g, 0) + gaussian_case(g)
    fixture_arrays.write(sys.argv[1], [(n, t.detach().float()) for n, t in records])


if __name__ == "__main__":
    main()
