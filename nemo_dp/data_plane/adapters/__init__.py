"""Data-plane adapters. Import them through ``nemo_dp.data_plane.factory``; nothing here is
imported eagerly, so that ``transfer_queue`` and Ray load only when that adapter is built."""
