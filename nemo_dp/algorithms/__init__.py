"""Losses, advantages, rollouts and the trainers: each is ``trainer(ctx: TrainContext)`` returning its final
counters ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}`` (``None``: never evaluated).
"""
