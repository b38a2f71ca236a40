"""Env streams move between processes: a stream's complete state saved after one task and restored
by another process goes on bit for bit (rlfarm.envs.snapshot, rlfarm.core.streams). Pure: two env
objects in one process stand for two worker processes; the farm tests are in test_streams.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from rlfarm.core import streams
from rlfarm.core.rollout import Rollout, collect, task_seeds
from rlfarm.core.streams import EnvStream, StreamBook, stream_seeds
from rlfarm.envs import describe, make_vector_env, snapshot

ENVS = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "tests.tiny_envs:long_episodes", "tests.tiny_envs:self_saving"]
try:
    import mujoco  # noqa: F401

    ENVS += ["HalfCheetah-v5", "Ant-v5"]  # Ant-v5 reads MuJoCo's derived positions before a step
except ImportError:  # the mujoco extra: its tests run where it is installed (.ci/run installs it)
    pass
try:
    import mpe2  # noqa: F401

    # Multi-agent envs (AgentVector): each game's PettingZoo objects, its agents' arrays.
    ENVS += ["mpe2/simple_spread_v3", "mpe2/simple_tag_v3", "rlfarm/four_rooms_two_level"]
    # A turn-based game (TurnVector): each game's board and turn, the seats, the opponents' generator.
    ENVS += ["pettingzoo/classic/connect_four_v3"]
except ImportError:  # the multiagent extra, likewise
    pass
try:
    import ale_py  # noqa: F401

    ENVS += ["ALE/Pong-v5"]  # AleVector: emulators, sticky actions, no-op starts, frame stacks
except ImportError:  # the atari extra, likewise
    pass


# Envs that need options: agents of different spaces act with policies of their own.
OPTIONS = {
    "mpe2/simple_tag_v3": {"policy_map": ["adversary_*=adversary", "agent_*=agent"]},
    "rlfarm/four_rooms_two_level": {"policy_map": ["upper=upper", "lower=lower"]},
}


def _actor(env_id: str, recurrent: str = ""):
    import torch

    from rlfarm.algos import network_for
    from rlfarm.config import PolicyConfig

    torch.manual_seed(0)
    config = PolicyConfig(hidden_sizes=(16,), recurrent=recurrent, recurrent_size=8)
    return network_for("ppo", describe(env_id, OPTIONS.get(env_id)), config).actor_snapshot()


def _tasks(env_id: str, n_envs: int, steps: int, tasks: int, move: bool, recurrent: str = "") -> list[Rollout]:
    """`tasks` tasks of one stream: in one process (`move=False`), or each in the other of two
    processes, which restores the stream from the snapshot the last task saved (`move=True`)."""
    actor = _actor(env_id, recurrent)
    seeds = stream_seeds(7, 0, 0, n_envs)
    here = [EnvStream(make_vector_env(env_id, n_envs, options=OPTIONS.get(env_id)), seeds) for _ in range(2)]
    # What a worker checks a snapshot against: the env's configuration, learned on a probe of one game.
    per_game = getattr(here[0].envs, "k", 1) if type(here[0].envs).__name__ == "AgentVector" else 1
    config = snapshot.configuration(make_vector_env(env_id, per_game, options=OPTIONS.get(env_id)))
    out, blob, digest = [], None, None
    for task in range(tasks):
        stream = here[task % 2 if move else 0]
        if blob is not None and stream.digest != digest:  # a genuine snapshot changes no configuration
            streams.resume(stream, streams.decode(blob, digest), lambda e, s: snapshot.restore(e, s, config))
        out.append(collect(actor, stream.envs, steps, [], task_seeds(7, task, 0, n_envs)[1], stream=stream))
        blob, digest = streams.encode(stream, snapshot.capture(stream.envs))
        stream.digest = digest
    return out


@pytest.mark.parametrize("env_id", ENVS)
def test_a_stream_restored_in_another_process_goes_on_bit_for_bit(env_id):
    """Six tasks of one stream, each in the other of two processes, against the same six in one: every
    array of every task is equal, episodes spanning tasks included."""
    steps = 150 if env_id.endswith("-v5") else 90  # (Pong: 900 steps, a game's first points)
    n_envs = 2 * describe(env_id, OPTIONS.get(env_id)).agents  # (a multi-agent game: a sub-env per agent)
    alone = _tasks(env_id, n_envs, steps, 6, move=False)
    moved = _tasks(env_id, n_envs, steps, 6, move=True)
    for a, b in zip(alone, moved):
        for name, value in a.to_dict().items():
            if value is not None:
                np.testing.assert_array_equal(value, b.to_dict()[name], err_msg=f"{env_id}: {name}")
    assert sum(r.episode_returns.size for r in alone) or env_id.startswith(("tests.", "HalfCheetah", "Ant", "ALE"))


@pytest.mark.parametrize(
    ("env_id", "recurrent"),
    [("rlfarm/cartpole_no_vel", "lstm"), ("rlfarm/cartpole_no_vel", "gru"), ("tests.tiny_envs:image", "lstm")],
)
def test_a_recurrent_policys_state_moves_with_its_stream_bit_for_bit(env_id, recurrent):
    """A recurrent actor's memory of the running episodes is part of the stream's snapshot (issue 53):
    moved to the other process every task, the stream and the memory go on exactly as in one. Tasks
    of 40 steps, episodes of a few dozen (the policy is random) or of 16 (the image env, its CNN and
    core acted by ONNX Runtime or torch): episodes span tasks."""
    alone = _tasks(env_id, 3, 40, 6, move=False, recurrent=recurrent)
    moved = _tasks(env_id, 3, 40, 6, move=True, recurrent=recurrent)
    for a, b in zip(alone, moved):
        for name, value in a.to_dict().items():
            if value is not None:
                np.testing.assert_array_equal(value, b.to_dict()[name], err_msg=name)
    assert alone[3].states is not None and alone[3].states.any()  # a later task starts with a memory


def test_without_the_state_in_the_snapshot_a_moved_recurrent_stream_would_differ(monkeypatch):
    """The check above can fail: a snapshot that dropped the memory makes the moved stream act otherwise."""
    real = streams.encode

    def forgetful(stream, env_state):
        saved, stream.policy_state = stream.policy_state, None
        try:
            return real(stream, env_state)
        finally:
            stream.policy_state = saved

    monkeypatch.setattr(streams, "encode", forgetful)
    alone = _tasks("rlfarm/cartpole_no_vel", 3, 40, 4, move=False, recurrent="lstm")
    moved = _tasks("rlfarm/cartpole_no_vel", 3, 40, 4, move=True, recurrent="lstm")
    assert not all(np.array_equal(a.logprobs, b.logprobs) for a, b in zip(alone, moved))


def test_an_env_holding_an_object_rlfarm_cannot_save_is_refused_by_name():
    with pytest.raises(snapshot.Unsnapshotable) as caught:
        snapshot.check("tests.tiny_envs:opaque")
    text = str(caught.value)
    assert "OpaqueEnv.sim" in text and "rlfarm_snapshot" in text and 'farm.episodes = "fresh"' in text
    snapshot.check("tests.tiny_envs:self_saving")  # the same env saving its state itself


def test_a_snapshot_is_checked_against_its_digest_before_it_is_decoded():
    envs = make_vector_env("CartPole-v1", 1)
    stream = EnvStream(envs, [0])
    collect(_actor("CartPole-v1"), envs, 5, [], 0, stream=stream)
    blob, digest = streams.encode(stream, snapshot.capture(envs))
    assert streams.decode(blob, digest)["obs"].shape == (1, 4)
    forged = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(streams.SnapshotError, match="does not match its digest"):
        streams.decode(forged, digest)
    other = make_vector_env("Pendulum-v1", 1)
    with pytest.raises(ValueError):  # a snapshot of another env is refused, not half applied
        snapshot.restore(other, snapshot.capture(envs))


def test_the_book_advances_each_stream_and_says_once_when_one_restarts():
    book = StreamBook(2)
    assert book.ref(1) == {"index": 1, "after": None, "restarts": 0}
    assert book.advance({"index": 1, "digest": "aa", "restarts": 0, "bytes": 10}, 1) == (None, None)
    assert book.ref(1)["after"] == "aa"
    old, notice = book.advance({"index": 1, "digest": "bb", "restarts": 1, "restart": "snapshot aa is not in Redis"}, 1)
    assert old == "aa" and "env stream 1 restarted" in notice and "not in Redis" in notice
    assert book.advance({"index": 1, "digest": "cc", "restarts": 1}, 1)[1] is None  # said once
    with pytest.raises(ValueError):
        book.advance({"index": 0, "digest": "dd"}, 1)  # a result of another stream
    resumed = StreamBook(3)  # ASYNC resumed on a larger farm: the first two go on, the third starts
    resumed.restore(book.state())
    assert [resumed.ref(i)["after"] for i in range(3)] == [None, "cc", None]
    assert book.summary()["restarted"] == 1 and book.summary()["tasks"] == 3


def test_an_object_graph_comes_back_sharing_what_it_shared():
    """rlfarm.envs.plain: a list, an array and an object held twice are one again once restored into
    a graph made anew, where nothing is shared yet; values, generators and tuples come back as saved."""
    from rlfarm.envs import plain

    class Part:
        def __init__(self):
            self.pos = np.zeros(2)

    class Game:
        def __init__(self):
            self.part = Part()
            self.order, self.agents = ["a", "b"], ["a", "b"]
            self.both = (self.part, 3)
            self.rng = np.random.default_rng(0)
            self.other = Part()

    saved = Game()
    saved.agents = saved.order  # one list under two names, as mpe2's agent selector holds it
    saved.other = saved.part
    saved.part.pos += 1.5
    saved.rng.random(3)
    blob = plain.capture_object(saved)
    fresh = Game()
    plain.restore_object(fresh, blob)
    assert fresh.agents is fresh.order and fresh.other is fresh.part and fresh.both[0] is fresh.part
    fresh.order.append("c")
    fresh.part.pos += 1
    assert fresh.agents == ["a", "b", "c"] and fresh.other.pos.tolist() == [2.5, 2.5]
    assert fresh.rng.random() == saved.rng.random()


@pytest.mark.parametrize("name", ["test", "seed", "__class__", "default_rng"])
def test_a_snapshot_names_only_numpys_bit_generators(monkeypatch, name):
    """A blob's bit generator name reached getattr(np.random, name)(): "test" ran numpy's test suite
    on a worker (issue 50). Only numpy's bit generator classes are built now."""
    import copy

    import numpy as np

    from rlfarm.envs.plain import plain, unplain

    called = []
    monkeypatch.setattr(np.random, "test", lambda *a, **k: called.append(a), raising=False)
    blob = plain(np.random.default_rng(3))
    forged = copy.deepcopy(blob)
    forged["v"]["v"][0][1] = name
    with pytest.raises(ValueError, match="not one of numpy's"):
        unplain(forged)
    assert not called
    assert unplain(copy.deepcopy(blob)).integers(1000) == np.random.default_rng(3).integers(1000)


def test_a_snapshots_arrays_are_bounded_by_the_snapshot_limit_not_a_results(monkeypatch):
    """A 173-byte blob declared arrays that took each pool process to 1.93 GiB: the blob's own
    decompression was bounded, its arrays only by the codec's 2 GiB for results (issue 50)."""
    import hashlib

    import numpy as np
    import zstandard

    from rlfarm.core import codec, streams

    message = {"env": {}, "obs": np.zeros(1_000_000, np.float32)}  # 4 MB of zeros: a few KB packed
    blob = zstandard.ZstdCompressor().compress(codec.pack(message))
    digest = hashlib.sha256(blob).hexdigest()
    assert streams.decode(blob, digest)["obs"].shape == (1_000_000,)
    monkeypatch.setattr(streams, "MAX_SNAPSHOT_BYTES", 1_000_000)
    assert len(blob) < 1_000
    with pytest.raises(streams.SnapshotError, match="declares 4,000,027 bytes, above the 1,000,000"):
        streams.decode(blob, digest)  # zstd's max_output_size alone let the declared 4 MB through


# ---- each restore check at its edge: a blob that passes every other check (issue 50) -----------
class _Board:
    def __init__(self):
        self.cells = [0, 0, 0]


class _Seat:
    def __init__(self):
        self.cells = [0, 0, 0]


class _Game:
    def __init__(self, inner):
        self.inner = inner
        self.moves = 0


def test_a_restored_object_must_be_of_the_class_it_was_saved_from():
    """Removing the class check passed the suite: its one mismatch (CartPole into Pendulum) is refused
    earlier, by the wrapper chain. Here the outer object matches and only an inner one does not."""
    from rlfarm.envs.plain import capture_object, restore_object

    saved = _Game(_Board())
    saved.inner.cells, saved.moves = [1, 2, 1], 3
    state = capture_object(saved)
    into = _Game(_Board())
    restore_object(into, state)
    assert into.inner.cells == [1, 2, 1] and into.moves == 3  # the same classes: restored
    with pytest.raises(ValueError, match="env snapshot of a _Board, not of a _Seat"):
        restore_object(_Game(_Seat()), state)


def test_a_vector_snapshot_restores_only_into_as_many_sub_envs():
    """Removing the sub-env count check passed the suite: zip() would restore 2 of 3 and leave the
    third as it was."""
    from rlfarm.envs import make_vector_env, snapshot

    env_id = "tests.tiny_envs:long_episodes"
    two = make_vector_env(env_id, 2, options={"id": env_id, "num_envs": 2})
    two.reset(seed=1)
    state = snapshot.capture(two)
    snapshot.restore(make_vector_env(env_id, 2, options={"id": env_id, "num_envs": 2}), state)
    with pytest.raises(ValueError, match="env snapshot of 2 sub-envs, not 3"):
        snapshot.restore(make_vector_env(env_id, 3, options={"id": env_id, "num_envs": 3}), state)


# ---- a snapshot is state, never configuration (issue 50) --------------------------------------------
def _cartpole_snapshot():
    envs = make_vector_env("CartPole-v1", 2)
    stream = EnvStream(envs, [0, 1])
    collect(_actor("CartPole-v1"), envs, 30, [], 0, stream=stream)
    return snapshot.capture(envs)


@pytest.mark.parametrize(
    "layer, attr, value",
    [(-1, "x_threshold", 1e9), (-1, "theta_threshold_radians", 1e9), (0, "_max_episode_steps", 10**9)],
)
def test_a_snapshot_that_sets_an_envs_configuration_is_refused_before_anything_is_written(layer, attr, value):
    """A genuine CartPole snapshot with its thresholds or its time limit set to 1e9 was restored in
    silence: the run's episodes never ended (greedy eval 9.5 against 418). The worker learns the env's
    configuration on a probe (values that never change from the reset through its first episodes),
    and a snapshot that changes one is refused, naming it, before any value is written."""
    import copy

    config = snapshot.configuration(make_vector_env("CartPole-v1", 1))
    genuine = _cartpole_snapshot()
    into = make_vector_env("CartPole-v1", 2)
    snapshot.restore(into, copy.deepcopy(genuine), config)  # what a worker saved: restored
    forged = copy.deepcopy(genuine)
    forged["envs"][1][layer]["attrs"][attr] = value
    fresh = make_vector_env("CartPole-v1", 2)
    before = snapshot.capture(fresh)
    owner = forged["envs"][1][layer]["class"]
    with pytest.raises(ValueError, match=f"sets {owner}.{attr}, which is the env's configuration"):
        snapshot.restore(fresh, forged, config)
    assert (
        streams.encode(EnvStream(fresh, [0, 0]), snapshot.capture(fresh))[1]
        == streams.encode(EnvStream(make_vector_env("CartPole-v1", 2), [0, 0]), before)[1]
    )  # nothing of it written


@pytest.mark.parametrize("attr", ["step", "env", "spec", "observation_space", "np_random"])
def test_a_snapshot_never_sets_a_method_a_property_or_configuration(attr):
    """Even without a probe: a value over a method, a property or configuration (the wrapped env,
    a space) is refused, not written."""
    import copy

    forged = copy.deepcopy(_cartpole_snapshot())
    forged["envs"][0][-1]["attrs"][attr] = 1.0
    with pytest.raises(ValueError, match=f"sets CartPoleEnv.{attr}, which is configuration"):
        snapshot.restore(make_vector_env("CartPole-v1", 2), forged)


def test_a_snapshot_holds_only_attributes_the_env_has():
    """A name the env never had in its probe (from its reset through its first episodes) is refused;
    one its reset makes (Pendulum's `state`, absent from an env not yet reset) is restored."""
    import copy

    config = snapshot.configuration(make_vector_env("CartPole-v1", 1))
    forged = copy.deepcopy(_cartpole_snapshot())
    forged["envs"][0][-1]["attrs"]["no_such_attribute"] = 1.0
    with pytest.raises(ValueError, match="sets CartPoleEnv.no_such_attribute, which the env has not"):
        snapshot.restore(make_vector_env("CartPole-v1", 2), forged, config)
    pendulum = make_vector_env("Pendulum-v1", 1)
    pendulum.reset(seed=0)
    saved = snapshot.capture(pendulum)
    fresh = make_vector_env("Pendulum-v1", 1)
    assert "state" not in vars(fresh.envs[0].unwrapped)
    snapshot.restore(fresh, saved, snapshot.configuration(make_vector_env("Pendulum-v1", 1)))
    np.testing.assert_array_equal(fresh.envs[0].unwrapped.state, pendulum.envs[0].unwrapped.state)


def test_a_restored_object_gets_no_value_over_a_method_a_property_or_configuration():
    """A game's objects (PettingZoo's) are written back attribute by attribute: a blob naming a
    method (`move`), a property or a space would have replaced it with a value."""
    import copy

    import gymnasium as gym

    from rlfarm.envs.plain import capture_object, restore_object

    class Piece:
        space = gym.spaces.Discrete(3)

        def __init__(self):
            self.at = 0
            self.box = gym.spaces.Discrete(2)

        def move(self):
            self.at += 1

        @property
        def where(self):
            return self.at

    saved = Piece()
    saved.move()
    state = capture_object(saved)
    restore_object(into := Piece(), copy.deepcopy(state))
    assert into.at == 1
    for name in ("move", "where", "box", "space"):
        forged = copy.deepcopy(state)
        forged["attrs"][name] = 5
        with pytest.raises(ValueError, match=f"Piece.{name}, which is configuration"):
            restore_object(Piece(), forged)


def test_a_restore_writes_into_the_arrays_already_there():
    """Other objects may hold a layer's arrays by reference (AtariPreprocessing's max-pool buffers are
    read so): restore copies into an array of the same shape instead of putting a new one there."""
    saved = make_vector_env("CartPole-v1", 1)
    saved.reset(seed=3)
    saved.step(np.array([1]))
    snap = snapshot.capture(saved)
    fresh = make_vector_env("CartPole-v1", 1)
    fresh.reset(seed=9)
    before = fresh.envs[0].unwrapped.state
    snapshot.restore(fresh, snap, snapshot.configuration(make_vector_env("CartPole-v1", 1)))
    assert fresh.envs[0].unwrapped.state is before
    np.testing.assert_array_equal(before, saved.envs[0].unwrapped.state)


def test_objects_first_met_inside_a_tuple_or_a_list_are_written_back_into_the_live_ones():
    """A game's objects held in a tuple or list (its agents) are restored into the objects at the same
    place, not made anew (an object cannot be made from a snapshot)."""
    from rlfarm.envs.plain import capture_object, restore_object

    class Part:
        def __init__(self):
            self.pos = np.zeros(2)

    class Game:
        def __init__(self):
            self.pair = (Part(), 1)
            self.parts = [Part(), Part()]

    saved = Game()
    saved.pair[0].pos += 2.0
    saved.parts[1].pos += 3.0
    state = capture_object(saved)
    live = Game()
    first, second = live.pair[0], live.parts[1]
    restore_object(live, state)
    assert live.pair[0] is first and live.parts[1] is second
    assert first.pos.tolist() == [2.0, 2.0] and second.pos.tolist() == [3.0, 3.0]


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the mujoco extra")
def test_a_mujoco_snapshot_restores_its_physics_and_only_into_a_mujoco_env():
    """The physics (MjData) of a MuJoCo env restored into a fresh one steps on identically; a blob
    that gives a classic-control env MuJoCo data is refused. (The bit-for-bit test holds this too,
    too slowly for mutation runs.)"""
    import copy

    env_id = "Hopper-v5"
    saved = make_vector_env(env_id, 1)
    saved.reset(seed=1)
    for _ in range(5):
        saved.step(np.full((1, 3), 0.3, np.float32))
    snap = snapshot.capture(saved)
    fresh = make_vector_env(env_id, 1)
    fresh.reset(seed=2)
    snapshot.restore(fresh, copy.deepcopy(snap))
    a = saved.step(np.full((1, 3), -0.2, np.float32))[0]
    b = fresh.step(np.full((1, 3), -0.2, np.float32))[0]
    np.testing.assert_array_equal(a, b)
    cartpole = snapshot.capture(make_vector_env("CartPole-v1", 1))
    cartpole["envs"][0][-1]["mjdata"] = snap["envs"][0][-1]["mjdata"]
    with pytest.raises(ValueError, match="holds MuJoCo data, CartPoleEnv is no MuJoCo env"):
        snapshot.restore(make_vector_env("CartPole-v1", 1), cartpole)


def test_a_snapshot_is_bounded_at_its_edges_and_must_be_a_streams(monkeypatch):
    """decode's bounds at their edges (mutation survivors): a frame declaring exactly the limit passes
    and one byte over does not; a frame that declares no size is cut at the limit; arrays that a
    small frame decompresses to more than the limit are refused; a message with no obs is no stream's."""
    import hashlib

    import zstandard

    from rlfarm.core import codec

    def blob_of(message, **zstd):
        blob = zstandard.ZstdCompressor(**zstd).compress(codec.pack(message))
        return blob, hashlib.sha256(blob).hexdigest()

    zeros = {"env": {}, "obs": np.zeros(250_000, np.float32)}  # 1 MB raw
    blob, digest = blob_of(zeros)
    declared = zstandard.frame_content_size(blob)
    monkeypatch.setattr(streams, "MAX_SNAPSHOT_BYTES", declared)
    assert streams.decode(blob, digest)["obs"].shape == (250_000,)  # at the limit
    monkeypatch.setattr(streams, "MAX_SNAPSHOT_BYTES", declared - 1)
    with pytest.raises(streams.SnapshotError, match="above the"):
        streams.decode(blob, digest)
    unsized, unsized_digest = blob_of(zeros, write_content_size=False)
    with pytest.raises(streams.SnapshotError, match="does not decompress"):
        streams.decode(unsized, unsized_digest)  # no size declared: cut at the limit
    packed = zstandard.ZstdCompressor().compress(codec.pack(zeros, compress="zstd", threshold=0))
    assert zstandard.frame_content_size(packed) < 100_000  # the frame is small, its arrays are not
    monkeypatch.setattr(streams, "MAX_SNAPSHOT_BYTES", 100_000)
    with pytest.raises(streams.SnapshotError, match="does not decode"):
        streams.decode(packed, hashlib.sha256(packed).hexdigest())
    for message in ({"env": {}}, {"obs": [1.0]}, {"env": [], "obs": [1.0]}):
        shapeless, shapeless_digest = blob_of(message)
        with pytest.raises(streams.SnapshotError, match="is not a stream's"):
            streams.decode(shapeless, shapeless_digest)
