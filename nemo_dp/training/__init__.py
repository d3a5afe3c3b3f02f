"""The run layer: what a launcher composes around the trainers (trackers, evaluation)."""
