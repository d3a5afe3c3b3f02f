"""nemo_dp.models"""
