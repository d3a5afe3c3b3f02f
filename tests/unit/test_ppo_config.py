"""PPO configuration: the group file and the recipe compose against the schema and validate;
bad values fail before any process starts, naming the key; the factory pairs are legal."""

from __future__ import annotations

from typing import Any

import pytest
from nemo_dp.config import validate_config, warm_start_config
from nemo_dp.config.schema import PPOConfig
from tests.compose import compose_run


def _compose(*overrides: str) -> Any:
    return compose_run(overrides)


def test_ppo_group_and_recipe_validate() -> None:
    obj = validate_config(_compose("~recipe", "algorithm=ppo"))
    assert isinstance(obj.algorithm, PPOConfig)
    assert obj.algorithm.ppo_epochs >= 1 and obj.algorithm.value.value_clip > 0
    cfg = _compose("recipe=ppo_arith")
    obj = validate_config(cfg)
    assert isinstance(obj.algorithm, PPOConfig) and obj.algorithm.warm_start.enabled
    # The recipe's warm start is the main GRPO recipe's (same SFT phase config).
    ws_ppo = warm_start_config(cfg)
    ws_grpo = warm_start_config(_compose("recipe=arith_main"))
    assert ws_ppo.algorithm == ws_grpo.algorithm
    assert ws_ppo.policy == ws_grpo.policy
    assert validate_config(_compose("recipe=ppo_arith", "data_plane=tq"))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.ppo_epochs=0", "algorithm.ppo_epochs"),
        ("algorithm.gamma=1.5", "algorithm.gamma"),
        ("algorithm.lam=-0.1", "algorithm.lam"),
        ("algorithm.kl_coef=-1", "algorithm.kl_coef"),
        ("algorithm.value.value_clip=-0.1", "algorithm.value.value_clip"),
        ("algorithm.value.lr=0", "algorithm.value.lr"),
    ],
)
def test_bad_ppo_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate_config(_compose("~recipe", "algorithm=ppo", override))


def test_unknown_ppo_key_and_illegal_pair_fail_at_compose_or_validate() -> None:
    with pytest.raises(Exception, match="gae_lambda"):
        _compose("~recipe", "algorithm=ppo", "algorithm.gae_lambda=0.9")
    with pytest.raises(ValueError, match="cannot run with data_plane='local'"):
        validate_config(_compose("~recipe", "algorithm=ppo", "data_plane=local"))
