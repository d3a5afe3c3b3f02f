"""nemo_dp.data: the arithmetic task, users' datasets, rendering to token ids with an exact loss
mask, and the dataset check before Ray starts (``nemo_dp.data.validation``).
"""
