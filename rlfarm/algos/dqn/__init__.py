"""DQN (Mnih et al. 2015) with Double DQN, n-step returns and optional prioritized replay: its config
section (config), Q-network and actors (policies), learner (dqn)."""
