"""Names shared by every producer and consumer of the data plane: fields, ``extra_info`` keys, tags, tasks."""

from __future__ import annotations

from typing import Literal

# --- field names --------------------------------------------------------------------------
INPUT_IDS = "input_ids"
INPUT_LENGTHS = "input_lengths"
SAMPLE_MASK = "sample_mask"
TOKEN_MASK = "token_mask"
GENERATION_LOGPROBS = "generation_logprobs"
PREV_LOGPROBS = "prev_logprobs"
REFERENCE_POLICY_LOGPROBS = "reference_policy_logprobs"
ADVANTAGES = "advantages"
VALUES = "values"
RETURNS = "returns"
META_IDX = "meta_idx"

# --- extra_info keys ----------------------------------------------------------------------
PAD_TO_MULTIPLE = "pad_to_multiple"
GLOBAL_FORWARD_PAD_SEQLEN = "global_forward_pad_seqlen"
MICRO_BATCH_INDICES = "micro_batch_indices"
MICRO_BATCH_LENGTHS = "micro_batch_lengths"
ELEM_COUNTS_PER_GB = "elem_counts_per_gb"
LOCAL_PARTITION_GENERATION = "local_partition_generation"

# --- tag names ----------------------------------------------------------------------------
TAG_STD = "std"
TAG_BASELINE = "baseline"
TAG_INPUT_LENGTHS = "input_lengths"

# --- partitions and tasks -----------------------------------------------------------------
TRAIN_PARTITION = "train"
VAL_PARTITION = "val"
TASK_PREV_LP = "prev_lp"
TASK_REF_LP = "ref_lp"
TASK_TRAIN = "train"
TASK_VAL = "val"
RESERVED_PREFIX = "__nemo_dp"

# --- field groups -------------------------------------------------------------------------
DP_TRAIN_FIELDS: tuple[str, ...] = (
    INPUT_IDS, INPUT_LENGTHS, GENERATION_LOGPROBS, PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS, ADVANTAGES, TOKEN_MASK,
    SAMPLE_MASK,
)
LP_SEED_FIELDS: tuple[str, ...] = (INPUT_IDS, INPUT_LENGTHS, TOKEN_MASK, SAMPLE_MASK)
VALUE_SEED_FIELDS: tuple[str, ...] = LP_SEED_FIELDS
PPO_VALUE_FIELDS: tuple[str, ...] = (VALUES, RETURNS)
DP_VALUE_TRAIN_FIELDS: tuple[str, ...] = LP_SEED_FIELDS + PPO_VALUE_FIELDS

TOKEN_ALIGNED_FIELDS: frozenset[str] = frozenset(
    {INPUT_IDS, GENERATION_LOGPROBS, PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS, ADVANTAGES, TOKEN_MASK, VALUES, RETURNS}
)

Layout = Literal["padded", "jagged"]
