"""Tiny envs whose correct rollout numbers can be computed by hand (also importable by workers)."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit


class CounterEnv(gym.Env):
    """obs = [steps taken in this episode]; reward 1 per step; terminates after `terminate_at` steps
    (never if None). Actions are ignored."""

    def __init__(self, terminate_at: int | None = None):
        self.observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.terminate_at = terminate_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        return np.array([float(self.t)], np.float32), 1.0, terminated, False, {}


class LongEnv(gym.Env):
    """1,000-step episodes with a known return: reward 1 per step plus 0.5 at the last one (1000.5),
    so an episode reported with a part missing or counted across two streams shows. obs = [t / 1000]
    plus noise from the env's RNG, so streams seeded alike would show as equal observations."""

    LENGTH, RETURN = 1000, 1000.5

    def __init__(self, step_seconds: float = 0.0):
        self.observation_space = gym.spaces.Box(-1, 2, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_seconds = step_seconds
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t / self.LENGTH, self.np_random.uniform(-1, 1)], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.step_seconds:
            time.sleep(self.step_seconds)  # a simulator's step: wall time, not CPU
        self.t += 1
        end = self.t >= self.LENGTH
        return self._obs(), 1.0 + 0.5 * end, end, False, {}


def long_episodes() -> gym.Env:
    return LongEnv()


def long_slow() -> gym.Env:
    """LongEnv at 1 ms a step: tasks last long enough to SIGKILL a worker in the middle of one."""
    return LongEnv(step_seconds=0.001)


def terminating() -> gym.Env:
    return CounterEnv(terminate_at=3)


def truncating() -> gym.Env:
    return TimeLimit(CounterEnv(terminate_at=None), max_episode_steps=3)


class SlowEnv(gym.Env):
    """CartPole-shaped spaces, sleeps per step: makes tasks long enough to kill a worker mid-task or cut
    it off mid-task, at no CPU cost (it used to busy-wait, and the fault tests that run thousands of
    its steps then took a third of the suite's CPU time). `hang_gil` is the env that holds the GIL."""

    def __init__(self, step_seconds: float = 0.002):
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_seconds = step_seconds

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-0.05, 0.05, 4).astype(np.float32), {}

    def step(self, action):
        import time

        time.sleep(self.step_seconds)
        return self.np_random.uniform(-0.05, 0.05, 4).astype(np.float32), 1.0, False, False, {}


# Episodes of the endless test envs end here: every run evaluates its final policy with greedy episodes.
EPISODE_STEPS = 100


def slow() -> gym.Env:
    return TimeLimit(SlowEnv(), max_episode_steps=EPISODE_STEPS)


class Float64Env(gym.Env):
    """Pendulum-shaped spaces whose observations are float64 (as many hand-written envs' are)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-8.0, 8.0, (3,), np.float64)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 3), {}

    def step(self, action):
        return self.np_random.uniform(-1, 1, 3), float(-np.square(action).sum()), False, False, {}


def float64() -> gym.Env:
    return Float64Env()


def broken() -> gym.Env:
    """An env constructor that fails, as one missing a licence or a simulator binary does."""
    raise RuntimeError("simulator licence not found")


class CrashingEnv(CounterEnv):
    """Made fine (the trainer reads its spaces), fails at its first step: a simulator that crashes mid-task."""

    def step(self, action):
        raise RuntimeError("the simulator crashed")


def crashing() -> gym.Env:
    return CrashingEnv()


class HangingEnv(SlowEnv):
    """Blocks forever in step() (a simulator that deadlocked), in every episode or only the first
    time any process of the machine gets there (`once`: a marker file named by RLFARM_TEST_HANG_MARKER).
    A process that hangs first appends its pid to RLFARM_TEST_HUNG_PIDS, if set, so a test knows which
    pool processes must be replaced."""

    def __init__(self, once: bool = False):
        super().__init__(step_seconds=0.0005)
        self.once = once

    def step(self, action):
        import os
        import time

        marker = os.environ.get("RLFARM_TEST_HANG_MARKER", "")
        if not self.once or (marker and _first_to_create(marker)):
            record = os.environ.get("RLFARM_TEST_HUNG_PIDS", "")
            if record:
                with open(record, "a") as f:
                    f.write(f"{os.getpid()}\n")
            while True:
                time.sleep(3600)
        return super().step(action)


def _first_to_create(path: str) -> bool:
    """Create `path` if no process has yet; True only for the one that did (O_EXCL: two processes
    stepping at the same moment cannot both see it missing and both hang)."""
    import os

    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def hang() -> gym.Env:
    return TimeLimit(HangingEnv(), max_episode_steps=EPISODE_STEPS)


def hang_once() -> gym.Env:
    return TimeLimit(HangingEnv(once=True), max_episode_steps=EPISODE_STEPS)


class StallingEnv(SlowEnv):
    """The first step any process of the machine takes (marker file RLFARM_TEST_HANG_MARKER) sleeps
    RLFARM_TEST_STALL_SECONDS, then steps on: a straggler that finishes, late (a simulator that
    stalled on a slow disk)."""

    def step(self, action):
        import os
        import time

        marker = os.environ.get("RLFARM_TEST_HANG_MARKER", "")
        if marker and _first_to_create(marker):
            time.sleep(float(os.environ.get("RLFARM_TEST_STALL_SECONDS", "5")))
        return super().step(action)


def stall_once() -> gym.Env:
    return TimeLimit(StallingEnv(), max_episode_steps=EPISODE_STEPS)


class NanRewardEnv(SlowEnv):
    """Rewards of NaN: at every step, or (`once`) only at the first step any process of the machine
    takes (marker file RLFARM_TEST_NAN_MARKER): a simulator that glitched once."""

    def __init__(self, once: bool = False):
        super().__init__(step_seconds=0.0)
        self.once = once

    def step(self, action):
        import os

        obs, reward, terminated, truncated, info = super().step(action)
        marker = os.environ.get("RLFARM_TEST_NAN_MARKER", "")
        if not self.once or (marker and _first_to_create(marker)):
            reward = float("nan")
        return obs, reward, terminated, truncated, info


def nan_rewards() -> gym.Env:
    return TimeLimit(NanRewardEnv(), max_episode_steps=EPISODE_STEPS)


def nan_once() -> gym.Env:
    return TimeLimit(NanRewardEnv(once=True), max_episode_steps=EPISODE_STEPS)


class FaultyEnv(SlowEnv):
    """An env whose simulator crashes (rlfarm.errors.EnvFault "simulator_crash"): at every step, or
    (`once`) only at the first step any process of the machine takes (marker RLFARM_TEST_FAULT_MARKER)."""

    def __init__(self, once: bool = False):
        super().__init__(step_seconds=0.0)
        self.once = once

    def step(self, action):
        import os

        from rlfarm.errors import EnvFault

        marker = os.environ.get("RLFARM_TEST_FAULT_MARKER", "")
        if not self.once or (marker and _first_to_create(marker)):
            raise EnvFault("simulator_crash", "lost its license server")
        return super().step(action)


def crash_once() -> gym.Env:
    return TimeLimit(FaultyEnv(once=True), max_episode_steps=EPISODE_STEPS)


def crash_always() -> gym.Env:
    return TimeLimit(FaultyEnv(), max_episode_steps=EPISODE_STEPS)


class WideEnv(SlowEnv):
    """CartPole-shaped actions, 30,000 float32 observations: 120 KB per step, for huge results."""

    def __init__(self, width: int = 30_000):
        super().__init__(step_seconds=0.0)
        self.observation_space = gym.spaces.Box(-1, 1, (width,), np.float32)
        self._obs = np.zeros(width, np.float32)

    def reset(self, *, seed=None, options=None):
        gym.Env.reset(self, seed=seed)
        return self._obs, {}

    def step(self, action):
        return self._obs, 1.0, False, False, {}


def wide() -> gym.Env:
    return TimeLimit(WideEnv(), max_episode_steps=EPISODE_STEPS)


class PaintedEnv(SlowEnv):
    """CartPole-shaped spaces, 20-step episodes, and rgb_array frames drawn with numpy alone (no
    pygame): for recording videos with `rlfarm eval --video` in tests."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode: str | None = None):
        super().__init__(step_seconds=0.0)
        self.render_mode = render_mode
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        obs, reward, _, _, info = super().step(action)
        return obs, reward, False, self.t >= 20, info

    def render(self):
        frame = np.zeros((64, 64, 3), np.uint8)
        frame[:, : 3 * self.t] = (200, 80, 40)
        return frame


def painted(render_mode: str | None = None) -> gym.Env:
    return PaintedEnv(render_mode)


class SideEnv(gym.Env):
    """A 2x16x16 uint8 image (CHW; HWC with `channels_last`): one half of the first channel is lit,
    chosen at random each step; reward 1 for the action naming the lit half (0 left, 1 right).
    16-step episodes. Learnable only by looking at the pixels: the image path end to end."""

    def __init__(self, channels_last: bool = False):
        shape = (16, 16, 2) if channels_last else (2, 16, 16)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.channels_last = channels_last
        self.t = 0
        self.side = 0

    def _obs(self) -> np.ndarray:
        frame = np.zeros((2, 16, 16), np.uint8)
        frame[0, :, self.side * 8 : (self.side + 1) * 8] = 255
        frame[1] = 7 * self.t  # a clock, so frames differ within an episode
        return frame.transpose(1, 2, 0).copy() if self.channels_last else frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.side = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.side)
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), reward, False, self.t >= 16, {}


def image() -> gym.Env:
    return SideEnv()


def image_hwc() -> gym.Env:
    return SideEnv(channels_last=True)


class SideBoxEnv(SideEnv):
    """SideEnv with a Box action in [-1, 1]: reward 1 when the action's sign names the lit half
    (negative: left). Image observations for continuous-action learners."""

    def __init__(self, channels_last: bool = False):
        super().__init__(channels_last)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action):
        return super().step(int(np.asarray(action).reshape(-1)[0] > 0))


def image_box() -> gym.Env:
    return SideBoxEnv()


def image_box_hwc() -> gym.Env:
    return SideBoxEnv(channels_last=True)


class BoundsEnv(gym.Env):
    """A 2-D Box action with asymmetric bounds, low [-1, 0] and high [3, 10]; obs = the last action,
    reward = -|action - (1, 5)| (the midpoints), 20-step episodes. Records every action it is given."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-20, 20, (2,), np.float32)
        self.action_space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 10.0], np.float32))
        self.received: list[np.ndarray] = []
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        action = np.asarray(action, np.float32)
        self.received.append(action.copy())
        self.t += 1
        reward = -float(np.abs(action - np.array([1.0, 5.0])).sum())
        return action.copy(), reward, False, self.t >= 20, {}


def bounds() -> gym.Env:
    return BoundsEnv()


class UnboundedEnv(SlowEnv):
    """CartPole-shaped observations, a Box action without bounds (-inf, inf)."""

    def __init__(self):
        super().__init__(step_seconds=0.0)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)


def unbounded() -> gym.Env:
    return UnboundedEnv()


class DictEnv(SlowEnv):
    """CartPole-shaped actions, a Dict observation space: rlfarm cannot act on it."""

    def __init__(self):
        super().__init__(step_seconds=0.0)
        self.observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,), np.float32)})


def dict_obs() -> gym.Env:
    return DictEnv()


class GilHangingEnv(SlowEnv):
    """Blocks forever in step() inside C code that holds the GIL, as a deadlocked simulator binding
    does: no other thread of its process runs again (a lease renewed from a thread there stops)."""

    def step(self, action):
        import ctypes

        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
        while True:
            libc.sleep(3600)


def hang_gil() -> gym.Env:
    return TimeLimit(GilHangingEnv(), max_episode_steps=EPISODE_STEPS)


class DeafHangingEnv(SlowEnv):
    """The first step any process of the machine takes (marker file RLFARM_TEST_HANG_MARKER) blocks
    forever with SIGUSR2 blocked, as C code stuck outside the interpreter is deaf to Python's
    signal handlers; every other step is SlowEnv's."""

    def step(self, action):
        import os
        import signal
        import time

        marker = os.environ.get("RLFARM_TEST_HANG_MARKER", "")
        if marker and _first_to_create(marker):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
            while True:
                time.sleep(3600)
        return super().step(action)


def hang_deaf_once() -> gym.Env:
    return TimeLimit(DeafHangingEnv(), max_episode_steps=EPISODE_STEPS)


class _Simulator:
    """An object whose state rlfarm cannot see into (a simulator handle, a socket to a game server)."""

    def __init__(self) -> None:
        self.t = 0


class OpaqueEnv(SlowEnv):
    """State inside an object rlfarm does not know how to save: "continue" episodes refuse it."""

    def __init__(self) -> None:
        super().__init__(step_seconds=0.0)
        self.sim = _Simulator()


def opaque() -> gym.Env:
    return OpaqueEnv()


class SelfSavingEnv(OpaqueEnv):
    """The same, saving its simulator's state itself (rlfarm_snapshot / rlfarm_restore)."""

    def step(self, action):
        self.sim.t += 1
        obs, reward, terminated, truncated, info = super().step(action)
        return obs + self.sim.t / 1000, reward, terminated, truncated, info

    def rlfarm_snapshot(self) -> dict:
        import json

        return {"t": self.sim.t, "rng": json.dumps(self.np_random.bit_generator.state)}

    def rlfarm_restore(self, state: dict) -> None:
        import json

        self.sim.t = state["t"]
        self.np_random.bit_generator.state = json.loads(state["rng"])


def self_saving() -> gym.Env:
    return SelfSavingEnv()


class Echo:
    """A PettingZoo Parallel env of two agents (duck-typed: no pettingzoo import). Each sees
    [its index, step / 10, a value drawn at reset]; both are rewarded 1 when they pick the same action,
    and the game is cut after `length` steps. With `leave_at`, agent_1 is done at that step alone; with
    `join_at`, agent_1 is not in the game until that step. `masked`: observations are PettingZoo's
    Dict of "observation" and "action_mask", action 1 is legal at even steps only, and `illegal`
    counts the illegal actions taken."""

    metadata = {"name": "echo_v0"}

    def __init__(
        self,
        length: int = 5,
        leave_at: int | None = None,
        other_space: bool = False,
        join_at: int | None = None,
        masked: bool = False,
    ) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.length, self.leave_at, self.other_space = length, leave_at, other_space
        self.join_at, self.masked, self.illegal = join_at, masked, 0
        self.rng = np.random.default_rng()

    def observation_space(self, agent: str) -> gym.Space:
        n = 4 if self.other_space and agent == "agent_1" else 3
        box = gym.spaces.Box(-10.0, 10.0, (n,), np.float32)
        if self.masked:
            return gym.spaces.Dict({"observation": box, "action_mask": gym.spaces.Box(0, 1, (2,), np.int8)})
        return box

    def action_space(self, agent: str) -> gym.spaces.Discrete:
        return gym.spaces.Discrete(2)

    def _legal(self) -> np.ndarray:
        return np.array([1, self.t % 2 == 0], np.int8)

    def _obs(self, agent: str) -> Any:
        obs = np.array([self.possible_agents.index(agent), self.t / 10, self.draw], np.float32)
        return {"observation": obs, "action_mask": self._legal()} if self.masked else obs

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.draw = 0, float(self.rng.random())
        self.agents = list(self.possible_agents) if self.join_at is None else ["agent_0"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict):
        if self.masked:
            self.illegal += sum(not self._legal()[int(v)] for v in actions.values())
        self.t += 1
        same = float(len(set(int(v) for v in actions.values())) == 1)
        rewards = {a: same for a in self.agents}
        cut = self.t >= self.length
        terminations = {
            a: self.leave_at is not None and a == "agent_1" and self.t == self.leave_at for a in self.agents
        }
        truncations = {a: cut for a in self.agents}
        joining = ["agent_1"] if self.join_at is not None and self.t == self.join_at and not cut else []
        obs = {a: self._obs(a) for a in self.agents + joining}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])] + joining
        return obs, rewards, terminations, truncations, {a: {} for a in obs}

    def close(self) -> None:
        pass


def echo() -> Echo:
    return Echo()


def echo_leaving() -> Echo:
    return Echo(leave_at=2)


def echo_other_spaces() -> Echo:
    return Echo(other_space=True)


def echo_joining() -> Echo:
    return Echo(join_at=2)


def echo_masked() -> Echo:
    return Echo(masked=True)
