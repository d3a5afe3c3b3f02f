"""Models layer: the protocols, one builder per ``policy`` option, generation, the value model, and
the policy / value driver facades with their Ray workers.
"""
