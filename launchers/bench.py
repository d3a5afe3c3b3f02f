"""Benchmarks for nemo_dp: ``python launchers/bench.py bench=<name>`` (``conf_bench/benchmark.yaml``).

The ``tq_raw`` backend lives here because inside ``nemo_dp`` only the TransferQueue adapter may
import ``transfer_queue``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]
if str(_REPO_ROOT) not in sys.path:  # running from a checkout without an installed package
    sys.path.insert(0, str(_REPO_ROOT))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from nemo_dp.bench import register_bench_configs, run_bench  # noqa: E402
from nemo_dp.bench.backends import Backend, timed  # noqa: E402
from nemo_dp.bench.common import TQ_RAW, Payload, verify_roundtrip  # noqa: E402
from nemo_dp.training.hydra_task import silence_known_noise  # noqa: E402


class RawTransferQueueBackend(Backend):
    """The raw ``kv_batch_put``/``kv_batch_get`` on the system the adapter client bootstrapped."""

    name = TQ_RAW

    def __init__(self) -> None:
        import transfer_queue  # deliberate: raw-library baseline for the adapter overhead

        self.tq = transfer_queue

    def once(self, payload: Payload, tag: str, verify: bool) -> dict[str, float]:
        pid = f"bench_raw_{tag}"
        fields = list(payload.td.keys())
        keys = payload.sample_ids
        put_ms, _ = timed(lambda: self.tq.kv_batch_put(keys=keys, partition_id=pid, fields=payload.td))
        try:
            get_ms, out = timed(lambda: self.tq.kv_batch_get(keys=keys, partition_id=pid, select_fields=fields))
            if verify:
                verify_roundtrip(payload, out, self.name)
            del out
        finally:
            self.tq.kv_clear(keys=keys, partition_id=pid)
        return {"put": put_ms, "get": get_ms}


@hydra.main(config_path="../conf_bench", config_name="benchmark", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: ``python launchers/bench.py bench=data_plane [overrides]``."""
    run_bench(cfg, Path(HydraConfig.get().runtime.output_dir), raw_backends={TQ_RAW: RawTransferQueueBackend})


if __name__ == "__main__":
    # Every bench starts a private Ray (before Ray is imported, as the training launcher does).
    silence_known_noise(local_ray=True)
    register_bench_configs()
    main()
