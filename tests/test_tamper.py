"""Writes to Redis by someone without the farm's secret, done for real against running runs.

- A forged blob is never pinned, nor re-signed into best_policy.safetensors (item 3).
- With RLFARM_SECRET, what workers refuse (a forged policy, a tampered task, forged run metadata) is
  counted, warned about, written back from the trainer's own copy and sent again: the run goes on
  and ends as it would have without the attack (item 2).
- Without a secret set by the user, the embedded default and `rlfarm up` make one, and a trainer or
  worker on a Redis elsewhere without RLFARM_SECRET says so (item 10).
"""

from __future__ import annotations

import pytest
import torch

from rlfarm import codec
from rlfarm.store import PolicyCorrupt, PolicyStore, connect

SECRET = "tamper-secret-0123456789abcdef"


def _zeroed(state):
    return {k: torch.zeros_like(v) for k, v in state.items()}


@pytest.mark.farm
def test_a_forged_blob_is_never_pinned_nor_signed_into_best_policy(redis_only, tmp_path, monkeypatch):
    """The trainer pins the version it evaluates and writes the best one to best_policy.safetensors,
    signed. A blob written over that version in Redis (zeroed weights, sha256 recomputed, the genuine
    hmac kept) must not become a validly signed best policy: the trainer uses its own copy."""
    from rlfarm.api import make_config
    from rlfarm.config import to_dict
    from rlfarm.metrics import RunLogger
    from rlfarm.protocol import Result
    from rlfarm.trainer import make_trainer

    monkeypatch.setenv("RLFARM_SECRET", SECRET)
    cfg = make_config("cartpole-ppo", run_id="pin-forged", logdir=str(tmp_path))
    trainer = make_trainer(cfg, redis_only.redis_url, tmp_path / "pin-forged")
    trainer.logger = RunLogger(tmp_path / "pin-forged", to_dict(cfg), cfg.total_steps, tensorboard=False)
    trainer.publish()  # v0
    genuine = trainer.algo.state()

    client = connect(redis_only.redis_url)  # the attacker: can write to Redis, has no secret
    key = "rlfarm:pin-forged:policy:0"
    _, meta = codec.decode_policy(client.get(key))
    client.set(key, codec.encode_policy(_zeroed(genuine), meta))

    trainer.evaluate()  # pins v0 for its evaluation tasks
    for index in range(cfg.eval.tasks):
        trainer.handle_eval(Result("eval", 0, index, version=0, returns=[10.0]))
    assert trainer.best_version == 0
    state, best = codec.decode_policy((tmp_path / "pin-forged" / "best_policy.safetensors").read_bytes(), SECRET)
    assert best["version"] == "0"
    for name, tensor in genuine.items():  # the trainer's weights, not the forged zeros
        assert torch.equal(state[name], tensor.cpu()), name
    assert any(t.abs().sum() > 0 for t in state.values())

    # A store that did not publish v0 itself (a resumed trainer) checks what it pins: refused.
    with pytest.raises(PolicyCorrupt, match="policy version 0 is corrupt: policy blob has a bad signature"):
        PolicyStore(client, "pin-forged").pin(0)
    trainer.logger.close()
