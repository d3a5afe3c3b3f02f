"""The run layer: phases, logging, checkpoints, resume, trackers, evaluation and the launcher's failure handling."""
