"""Reinforcement learning for set decoders from rewards, with exact trajectory likelihoods.

scoring: the exact log-likelihood of a sampler's rollout (its committed sets, in order);
rewards: rewards chosen by name; objective: group advantages and the clipped policy-gradient loss;
grpo: the training loop (launched by launch/rl.py, like training).
"""
