"""nemo_dp.data: the arithmetic task, users' datasets, tokenization with loss masks, the pre-Ray dataset check."""
