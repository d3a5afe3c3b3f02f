"""nemo_dp.environments"""
