"""nemo_dp.data"""
