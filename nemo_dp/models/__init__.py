"""Models layer: protocols, builders, generation, and the policy / value facades with their Ray workers."""
