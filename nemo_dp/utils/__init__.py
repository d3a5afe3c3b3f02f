"""nemo_dp.utils: the bottom layer (checkpoint I/O, seeding, metrics, packed tensors)."""
