"""AleVector: a task's vector of Atari envs. PURE: no Redis, no Celery.

A task's vector of Atari envs is `AleVector`: the same chain's arithmetic written out over ale-py's
emulators in one Python loop, its frames, rewards and episode ends the wrapper chain's bit for bit
from the reset on (no-op starts and sticky actions included; tests/test_atari.py), and a little
faster (benchmarks/atari_env.py). Unlike ale-py's C++ vector env it can save its complete state and
restore it in another process (`snapshot`, `restore`), so an env stream can move between workers.
Single envs (evaluation episodes, `rlfarm eval`) keep the wrappers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlfarm.envs.ale_state import MT_WORDS as _MT_WORDS
from rlfarm.envs.ale_state import ale_rng as _ale_rng
from rlfarm.envs.ale_state import checked_array as _checked_array
from rlfarm.envs.ale_state import generator as _generator
from rlfarm.envs.ale_state import generator_state as _generator_state
from rlfarm.envs.atari import INSTALL_HINT, screen_size
from rlfarm.errors import EnvError

SNAPSHOT_FORMAT = "rlfarm.envs.atari.AleVector/1"

FRAME_SKIP = 4


class AleVector(gym.vector.VectorEnv):
    """A vector of `num_envs` ale-py emulators (`ale_py.ALEInterface`) stepped in one loop in this
    process, computing what `make_env(env_id, options)` (the wrapper chain above) in a SAME_STEP
    `SyncVectorEnv` computes, bit for bit from the reset on: ale_py.env.AtariEnv's seeding, no-op
    starts, sticky actions, the episode frame cap, game mode and difficulty (the registered id's
    kwargs), frame skip 4 with the max-pool written into buffer 0, 84x84 INTER_AREA grayscale, the
    frame stack padded with the reset frame. Its contract is the one `collect` reads: SAME_STEP
    autoreset with info["final_obs"] and info["final_info"], info["raw_reward"] (the game score),
    info["life_lost"] with `terminal_on_life_loss`, rewards clipped to their sign with `clip_rewards`.

    `snapshot()` is the complete state of every sub-env as msgpack-friendly values (rlfarm.core.codec),
    `restore()` puts it into any AleVector of the same id, size and options, in any process: it goes on
    as if it had never moved. ALE's own saved state lacks one thing the next frames depend on: the
    action a sticky repeat replays (StellaEnvironment::m_player_a_action). AleVector follows it by
    drawing the same mt19937 numbers ALE draws (its state read from ALE's saved state at every reset)
    and sets it back on restore."""

    def __init__(self, env_id: str, num_envs: int, options: Mapping[str, Any]):
        try:
            import ale_py
            import cv2
        except ImportError:
            raise EnvError(f"Atari envs need the atari extra (and OpenCV): {INSTALL_HINT}") from None
        from ale_py import roms
        from gymnasium.vector import AutoresetMode
        from gymnasium.vector.utils import batch_space

        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        registered = gym.registry[env_id].kwargs
        if registered.get("continuous", False):
            raise EnvError(f"env {env_id!r}: continuous ALE actions are not supported")
        size = screen_size(options)
        if size < 1:
            raise ValueError(f"screen_size must be at least 1, got {size}")
        self._resize = lambda frame: cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)
        self._ALEState = ale_py.ALEState
        self.num_envs = num_envs
        self.noop_max = int(options.get("noop_max", 30))
        self.frame_stack = int(options.get("frame_stack", 4))
        self.clip = bool(options.get("clip_rewards", True))
        self.signal_life_loss = bool(options.get("terminal_on_life_loss", False))
        if self.noop_max < 0 or self.frame_stack < 1:
            raise ValueError(f"noop_max must be >= 0 and frame_stack >= 1, got {self.noop_max}, {self.frame_stack}")
        max_frames = registered.get("max_num_frames_per_episode")  # None: ALE's default, as AtariEnv
        # What the state means: a snapshot restores only into an AleVector with the same (restore).
        self._config: dict[str, Any] = {
            "game": str(registered["game"]),
            "mode": registered.get("mode"),
            "difficulty": registered.get("difficulty"),
            "repeat_action_probability": float(registered.get("repeat_action_probability", 0.25)),
            "full_action_space": bool(registered.get("full_action_space", False)),
            "max_num_frames_per_episode": None if max_frames is None else int(max_frames),
            "num_envs": num_envs,
            "noop_max": self.noop_max,
            "frame_stack": self.frame_stack,
            "clip_rewards": self.clip,
            "terminal_on_life_loss": self.signal_life_loss,
            "screen_size": size,
        }
        self._rom = roms.get_rom_path(self._config["game"])

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self._ales: list[Any] = []
        self._np_random: list[np.random.Generator] = []
        for i in range(num_envs):  # as AtariEnv.__init__, in its order
            ale = ale_py.ALEInterface()
            ale.setFloat("repeat_action_probability", self._config["repeat_action_probability"])
            if max_frames is not None:
                ale.setInt("max_num_frames_per_episode", int(max_frames))
            ale.setBool("sound_obs", False)
            self._ales.append(ale)
            self._np_random.append(None)  # type: ignore[arg-type] - set by _seed_game at once
            self._seed_game(i, None)
            self._load_game(i)
        first = self._ales[0]
        full = self._config["full_action_space"]
        self._action_set = first.getLegalActionSet() if full else first.getMinimalActionSet()
        self._noop = ale_py.Action.NOOP
        if self.noop_max > 0 and self._action_set[0] != self._noop:
            raise EnvError(f"env {env_id!r}: no-op starts need NOOP as action 0, its actions are {self._action_set}")
        self._actions_by_value = {a.value: a for a in first.getLegalActionSet()}

        # Sticky actions: ALE keeps the frame's action with probability 1 - p, drawing u32/2^32 >= p
        # from its mt19937 twice a frame (players A and B). p as ALE holds it (a C float).
        p = first.getFloat("repeat_action_probability")
        self._sticky_threshold = math.ceil(p * 2**32)  # u32 >= this: the new action is taken
        self._sticky_draws = 0 < p < 1  # otherwise the outcome needs no draw: always, or never
        self._sticky = np.full(num_envs, self._noop.value, np.int64)  # the action a repeat replays
        # ALE's generators as AleVector follows them (made once: a new MT19937 seeds itself, slowly).
        self._replicas = [np.random.MT19937(0) for _ in range(num_envs)] if self._sticky_draws else []
        self._probe = np.random.MT19937(0)
        for i in range(num_envs):  # loadROM reset the game: a snapshot may come before any reset
            self._follow_generator(i)

        height, width = first.getScreenDims()
        self._pool = np.zeros((num_envs, 2, height, width), np.uint8)  # AtariPreprocessing.obs_buffer
        self._frames = np.zeros((num_envs, self.frame_stack, size, size), np.uint8)  # oldest first
        self._lives = np.zeros(num_envs, np.int64)  # LifeLossSignal.lives

        self.single_observation_space = gym.spaces.Box(0, 255, (self.frame_stack, size, size), np.uint8)
        self.single_action_space = gym.spaces.Discrete(len(self._action_set))
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    # -- AtariEnv's seeding and reset ---------------------------------------------------------------

    def _seed_game(self, i: int, seed: int | None) -> None:
        """AtariEnv.seed_game: two words of SeedSequence(seed), one for the numpy generator (no-op
        starts), one for ALE's (sticky actions), which ALE takes at the next loadROM."""
        from gymnasium.utils import seeding

        np_seed, ale_seed = np.random.SeedSequence(seed).generate_state(2)
        self._np_random[i], _ = seeding.np_random(int(np_seed))
        ale_seed = int(ale_seed)  # AtariEnv passes np.int32(ale_seed): the same bits, signed
        self._ales[i].setInt("random_seed", ale_seed - 2**32 if ale_seed >= 2**31 else ale_seed)

    def _load_game(self, i: int) -> None:
        ale = self._ales[i]
        ale.loadROM(self._rom)
        if self._config["mode"] is not None:
            ale.setMode(self._config["mode"])
        if self._config["difficulty"] is not None:
            ale.setDifficulty(self._config["difficulty"])

    def _reset_game(self, i: int, seed: int | None) -> None:
        """AtariEnv.reset: a seed re-seeds and reloads the ROM; without one the generators go on."""
        if seed is not None:
            self._seed_game(i, seed)
            self._load_game(i)
        self._ales[i].reset_game()

    def _reset_env(self, i: int, seed: int | None) -> None:
        """The chain's reset of one sub-env: AtariPreprocessing's no-op starts (a game that ends
        during them is reset again, with the same seed), then its buffers, the stack padded with the
        reset frame, LifeLossSignal's lives."""
        ale = self._ales[i]
        self._reset_game(i, seed)
        if self.noop_max > 0:
            for _ in range(self._np_random[i].integers(1, self.noop_max + 1)):
                ale.act(self._action_set[0])
                if ale.game_over():
                    self._reset_game(i, seed)
        pooled, other = self._pool[i]
        ale.getScreenGrayscale(pooled)
        other.fill(0)  # the max-pool with zeros leaves `pooled` as it is
        self._frames[i] = self._resize(pooled)
        self._lives[i] = ale.lives()
        self._follow_generator(i)

    def _follow_generator(self, i: int) -> None:
        """Right after ALE's reset (which sets NOOP) and no-ops: a sticky repeat replays NOOP, and
        the draws from ALE's generator as it stands now are followed (_follow_sticky)."""
        self._sticky[i] = self._noop.value
        if self._sticky_draws:
            self._replicas[i].state = _ale_rng(self._ales[i].cloneState(include_rng=True).serialize())

    def _seeds(self, seed: Any) -> list[int | None]:
        """Per-env seeds as SyncVectorEnv takes them: None, one int (seed + i), or one per env."""
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds: list[Any] = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        for s in seeds:
            if s is not None and (not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0):
                raise ValueError(f"seeds must be non-negative integers or None, got {s!r}")
        return [None if s is None else int(s) for s in seeds]

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[np.ndarray, dict]:
        for i, s in enumerate(self._seeds(seed)):
            self._reset_env(i, s)
        return self._frames.copy(), {}

    # -- the step -----------------------------------------------------------------------------------

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        chosen = np.asarray(actions).tolist()
        n = self.num_envs
        if len(chosen) != n:
            raise ValueError(f"{len(chosen)} actions for {n} envs")
        raw = np.zeros(n)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        life_lost = np.zeros(n, bool)
        ended = []
        frames = self._frames
        frames[:, :-1] = frames[:, 1:]  # FrameStackObservation: the oldest frame out
        for i in range(n):
            ale, action = self._ales[i], self._action_set[chosen[i]]
            pooled, other = self._pool[i]
            reward, emulated, over = 0, 0, False
            for t in range(FRAME_SKIP):  # AtariPreprocessing.step
                reward += ale.act(action)
                emulated += 1
                if ale.game_over():  # terminated or truncated: the buffers keep what they hold
                    over = True
                    break
                if t == FRAME_SKIP - 2:
                    ale.getScreenGrayscale(other)
                elif t == FRAME_SKIP - 1:
                    ale.getScreenGrayscale(pooled)
            self._follow_sticky(i, action, emulated)
            np.maximum(pooled, other, out=pooled)
            frames[i, -1] = self._resize(pooled)
            raw[i] = reward
            if over:
                terminated[i] = ale.game_over(with_truncation=False)
                truncated[i] = ale.game_truncated()
                ended.append(i)
            if self.signal_life_loss:  # LifeLossSignal
                lives = ale.lives()
                life_lost[i] = lives < self._lives[i] and not over
                self._lives[i] = lives
        per_step: dict[str, np.ndarray] = {"raw_reward": raw}
        if self.signal_life_loss:
            per_step["life_lost"] = life_lost
        # Where an episode ended, SAME_STEP readers take the step's own values from final_info.
        info: dict[str, Any] = {**per_step, "final_info": per_step}
        if ended:
            final_obs = np.zeros_like(frames)
            for i in ended:
                final_obs[i] = frames[i]
                self._reset_env(i, None)
            info["final_obs"], info["_final_obs"] = final_obs, np.isin(np.arange(n), ended)
        return frames.copy(), (np.sign(raw) if self.clip else raw), terminated, truncated, info

    def _follow_sticky(self, i: int, action: Any, emulated: int) -> None:
        """The action ALE's next sticky repeat would replay, after `emulated` frames asked `action`."""
        if self._sticky_draws:
            draws = self._replicas[i].random_raw(2 * emulated)
            if draws[::2].max() >= self._sticky_threshold:  # player A's draws
                self._sticky[i] = action.value
        elif self._sticky_threshold == 0:  # p = 0: every frame takes its action
            self._sticky[i] = action.value

    def close_extras(self, **kwargs: Any) -> None:
        self._ales = []

    # -- snapshot and restore -----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The complete state of every sub-env, as values rlfarm.core.codec packs (arrays, str, int,
        float, bool, None, lists and dicts of those)."""
        states = [ale.cloneState(include_rng=True).serialize() for ale in self._ales]
        if self._sticky_draws:
            for i, state in enumerate(states):
                if not self._same_stream(self._replicas[i].state, _ale_rng(state)):
                    raise EnvError(
                        f"{self._config['game']}: sticky actions drew numbers AleVector did not "
                        "follow (the game draws from ALE's generator itself): no exact snapshot"
                    )
        return {
            "format": SNAPSHOT_FORMAT,
            "config": dict(self._config),
            # One array rather than bytes per env: codec.pack(compress=...) compresses arrays only.
            "ale_states": np.frombuffer(b"".join(states), np.uint8),
            "ale_state_sizes": np.array([len(s) for s in states], np.int64),
            "sticky_actions": self._sticky.copy(),
            "np_random": [_generator_state(g) for g in self._np_random],
            "max_pool": self._pool.copy(),
            "frames": self._frames.copy(),
            "lives": self._lives.copy(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from `snapshot()`'s state, made by an AleVector of the same id, size and options
        (ValueError otherwise, and for anything malformed: everything is checked before any sub-env
        changes). The bytes are trusted to be what a snapshot wrote (the caller checks a digest);
        ALE's deserializer gets only states whose framing is checked here."""
        if not isinstance(state, Mapping) or state.get("format") != SNAPSHOT_FORMAT:
            found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"not an AleVector snapshot ({SNAPSHOT_FORMAT}): {found!r:.80}")
        config = state.get("config")
        if not isinstance(config, Mapping) or dict(config) != self._config:
            theirs = dict(config) if isinstance(config, Mapping) else {}
            differ = [
                f"{k}: snapshot {theirs.get(k)!r}, here {self._config.get(k)!r}"
                for k in sorted(set(theirs) | set(self._config))
                if theirs.get(k) != self._config.get(k)
            ]
            raise ValueError(f"snapshot of another env: {'; '.join(differ) or config!r:.300}")
        n = self.num_envs
        sizes = _checked_array(state, "ale_state_sizes", np.int64, (n,))
        if (sizes < 36).any():  # six ints, a string's length, two ints
            raise ValueError("snapshot: an ALE state is too short")
        blob = _checked_array(state, "ale_states", np.uint8, (int(sizes.sum()),))
        sticky = _checked_array(state, "sticky_actions", np.int64, (n,))
        if not set(sticky.tolist()) <= set(self._actions_by_value):
            raise ValueError(f"snapshot: sticky actions {sorted(set(sticky.tolist()))} are not all ALE actions")
        pool = _checked_array(state, "max_pool", np.uint8, self._pool.shape)
        frames = _checked_array(state, "frames", np.uint8, self._frames.shape)
        lives = _checked_array(state, "lives", np.int64, (n,))
        generators = state.get("np_random")
        if not isinstance(generators, (list, tuple)) or len(generators) != n:
            raise ValueError(f"snapshot: np_random must be a list of {n} generator states")
        np_random = [_generator(g) for g in generators]
        ale_states, rngs = [], []
        ends = np.cumsum(sizes).tolist()
        for start, end in zip([0] + ends[:-1], ends):
            serialized = blob[start:end].tobytes()
            rngs.append(_ale_rng(serialized))  # checks the framing, which ALE's reader does not
            try:
                ale_states.append(self._ALEState(serialized))
            except Exception as exc:  # noqa: BLE001 - nanobind answers a bad state with SystemError
                raise ValueError(f"snapshot: ALE refused a state: {type(exc).__name__}") from None

        for i, ale in enumerate(self._ales):
            try:
                self._restore_sticky(ale, ale_states[i], rngs[i], self._actions_by_value[int(sticky[i])])
                if self._sticky_draws:
                    self._replicas[i].state = rngs[i]
            except Exception as exc:  # noqa: BLE001 - as above; the sub-envs before it are restored
                raise ValueError(
                    f"snapshot: ALE could not restore sub-env {i} ({type(exc).__name__}); "
                    "this AleVector is now half restored: reset it or drop it"
                ) from None
        self._sticky[:] = sticky
        self._np_random = np_random
        self._pool[:] = pool
        self._frames[:] = frames
        self._lives[:] = lives

    def _same_stream(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        """Whether two MT19937 states give the same numbers: the same words and position, or else
        the same next 624 outputs (which fix an mt19937's state; libc++'s text is another form)."""
        if a["state"]["pos"] == b["state"]["pos"] and np.array_equal(a["state"]["key"], b["state"]["key"]):
            return True
        outputs = []
        for state in (a, b):
            self._probe.state = state
            outputs.append(self._probe.random_raw(_MT_WORDS))
        return bool(np.array_equal(*outputs))

    def _restore_sticky(self, ale: Any, state: Any, rng: dict[str, Any], action: Any) -> None:
        """Restore `state` into `ale` with `action` as the one a sticky repeat replays. ALE's state
        does not hold it, but act() sets it when its draw says so: act it on the restored state
        (whose draws `rng` foretells) until a draw takes it, then restore the state again."""
        ale.restoreState(state)
        if self._sticky_threshold <= 2**32 - 1:  # p = 1 (never taken): it is NOOP, as ALE left it
            probe = self._probe
            probe.state = rng
            while True:
                taken = probe.random_raw(2)[0] >= self._sticky_threshold
                ale.act(action)  # a terminal state emulates nothing but still takes the action
                if taken:
                    break
            ale.restoreState(state)
