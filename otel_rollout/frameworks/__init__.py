"""Hooks into RL frameworks (verl, ...): they know the training step, the engines do not.

An engine instrumentor sees requests; a framework hook only says which training step they belong
to, by running the framework's own rollout call inside ``rollout_step(<its step number>)``.
"""
