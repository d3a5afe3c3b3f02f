"""The run layer: phases, logging, checkpoints, resume and the launcher's failure handling."""
