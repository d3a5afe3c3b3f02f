"""Models layer: the model / tokenizer / loss protocols (``protocol``), one builder per
``policy`` option (``builders``; ``tiny/`` and ``hf/``), generation, the value model, and the
policy / value driver facades with their Ray workers."""
