"""rlver_jax: reinforcement learning with verifiable emotion rewards, in JAX."""
