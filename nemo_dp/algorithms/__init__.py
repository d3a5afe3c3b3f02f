"""nemo_dp.algorithms: losses, advantages, GAE, rollouts and the trainers.

Every trainer (legacy ``sft`` / ``grpo`` / ``ppo`` and their data-plane twins ``*_sync``) is
called as ``trainer(ctx)`` with a ``TrainContext`` (``context.py``); the run layer above
(``nemo_dp.training``) builds the context and picks the trainer through the factory.
"""
