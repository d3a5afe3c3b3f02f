"""nemo_dp.algorithms: losses, advantages, GAE, rollouts and the trainers.

Every trainer is called as ``trainer(ctx)`` with a ``TrainContext`` (``context.py``).
"""
