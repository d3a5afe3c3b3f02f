"""The PPO critic's model: any ``CausalLM`` backbone (LM head frozen) plus a zero-initialised scalar head."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from nemo_dp.models.protocol import CausalLM

__all__ = ["ValueModel", "VALUE_HEAD_PREFIX", "BACKBONE_PREFIX", "VALUE_HEAD_FILE"]

#: State-dict prefix of the scalar head's parameters.
VALUE_HEAD_PREFIX = "value_head."
#: State-dict prefix of the backbone's parameters.
BACKBONE_PREFIX = "backbone."
#: File the head is saved to next to the backbone's own files.
VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """``backbone`` + a zero-initialised ``Linear(hidden_size, 1, bias=False)`` head on its hidden states."""

    def __init__(self, backbone: CausalLM) -> None:
        super().__init__()
        self.backbone = backbone
        weight = next(iter(backbone.parameters()))
        self.value_head = nn.Linear(backbone.hidden_size, 1, bias=False, dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            self.value_head.weight.zero_()
        for p in backbone.lm_head_only_parameters():
            p.requires_grad_(False)

    @property
    def max_positions(self) -> int:
        """The backbone's longest sequence."""
        return self.backbone.max_positions

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Per-position values ``[B, S]``: column ``t`` is the value after having seen tokens ``<= t``."""
        return self.value_head(self.backbone.hidden_states(input_ids)).squeeze(-1)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write the backbone in its own format plus ``value_head.safetensors`` into ``directory``."""
        from safetensors.torch import save_file

        out = Path(directory)
        self.backbone.save_pretrained(out)
        head = {"weight": self.value_head.weight.detach().cpu().contiguous()}
        save_file(head, str(out / VALUE_HEAD_FILE), metadata={"format": "pt"})
