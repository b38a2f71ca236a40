"""Config sections' base, PURE (no torch, no I/O): what an algorithm's section is and the checks
sections share (algo), the upper bounds of every number that starts processes or allocates memory
(bounds). Below both rlfarm.config, which assembles RunConfig from sections, and rlfarm.algos, whose
packages own their sections (`algos/<name>/config.py`): an algorithm's section imports only this
package, so the config and the algorithms import each other one way (docs/architecture.md, decision 34).
"""
