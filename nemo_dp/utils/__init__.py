"""nemo_dp.utils"""
