"""SAC (Haarnoja et al. 2018): its config section (config), squashed Gaussian policy, soft Q-networks and
actors (policies), learner (sac)."""
