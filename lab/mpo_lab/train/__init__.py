"""What trains on the lab's toy tasks: :mod:`.sampler` (multi-turn rollouts of a causal LM on
a :class:`~mpo_lab.envs.MultiTurnEnv`), :mod:`.generation` (the model calls it makes, with a
KV cache) and :mod:`.models` (``TinyCausalLM`` and a tiny Hugging Face model). The learner
itself is the library's (:class:`mpo_rs.torch.Learner`)."""
