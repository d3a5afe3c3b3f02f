"""nemo_dp.algorithms: losses, advantages, GAE, rollouts and the trainers.

Every trainer is called as ``trainer(ctx)`` with a ``TrainContext`` (``context.py``) and returns
its final counters ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}``
(accuracies ``None`` when never evaluated).
"""
