"""nemo_dp.distributed: the batch container, sharding, packing, Ray start-up and worker groups."""
