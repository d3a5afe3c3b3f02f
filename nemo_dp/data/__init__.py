"""nemo_dp.data: the built-in arithmetic task, users' jsonl datasets (prompt/response and chat
``messages``), their rendering to token ids with an exact loss mask, and the check that every
configured dataset is usable before Ray starts (``nemo_dp.data.validation``)."""
