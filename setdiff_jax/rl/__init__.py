"""Reinforcement learning for set decoders from rewards, with exact trajectory likelihoods.

scoring: the exact log-likelihood of a sampler's rollout (its committed sets, in order);
rewards: rewards chosen by name; objective: group advantages and the clipped policy-gradient loss;
config: an RL run's config (defaults, checks, the run config built from the SFT run's);
prompts: the train prompts as the SFT run encoded them; sft_start: the SFT step RL starts from
(checked before anything is written, reloaded as the KL reference);
grpo: the training loop (launched by launch/rl.py, like training).
"""
