"""nemo_dp.algorithms"""
