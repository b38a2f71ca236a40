"""PPO (Schulman et al. 2017): its config section (config), networks and actors (policies), the SYNC
learner (ppo) and the ASYNC one corrected for policy lag with V-trace (appo)."""
