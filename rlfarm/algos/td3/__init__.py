"""TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods"): its
config section (config), deterministic tanh actor and the actors workers act with (policies), learner
(td3): twin critics, delayed policy updates, target policy smoothing."""
