"""The policy channel: how a policy travels from the trainer to the processes that act with it, in one
place.

- `store.py` (PolicyStore): the trainer publishes each version as one signed blob under its number, moves
  the run's pointer to it, lists it, and trims old ones (pins keep the best and those being evaluated);
  the run's metadata travels here too. Everything it writes it keeps a copy of, to write back what
  Redis lost or someone else overwrote.
- `lines.py` (LinedStore): a run of several policies (`env.policy_map`) publishes each policy on a
  version line of its own beside the run's, and each run version's signed metadata names the line
  versions it is made of.
- `receiver.py` (PolicyReceiver): a worker resolves the version a task acts with, fetches its blob (or
  each line version's) once per machine, and checks it before its tensors are used.
- `machine.py` (SharedPolicies): the copies a machine's worker processes share, so one of them fetches
  a version from Redis and the others read its file.

The blob's format and its signature are rlfarm.core.codec's and rlfarm.core.signing's; the keys are
rlfarm.farm.keys'. What a worker makes of the tensors (actors, networks, their cache) is
rlfarm.worker.policies'.
"""
