"""Evaluation in one place: the trainer's greedy-evaluation bookkeeping (bookkeeping: pure), playing a
stored policy on its env (playback: `rlfarm eval`'s back-end, and the trainer's videos) and
`rlfarm.load`'s policy (loaded). Above farm, below observe and the trainer."""
