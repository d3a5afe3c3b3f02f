"""nemo_dp.config"""
