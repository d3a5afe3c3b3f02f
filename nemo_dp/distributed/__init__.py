"""nemo_dp.distributed"""
