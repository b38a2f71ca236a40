"""The farm's data, PURE (numpy, msgpack, safetensors; no Redis, no Celery): what a task carries and a
result returns (protocol), bytes on the wire and in the policy store (codec, signing), collecting
experience (rollout) and replaying it (replay). See docs/architecture.md."""
