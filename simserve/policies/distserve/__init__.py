"""Policy `distserve`: static prefill/decode disaggregation (DistServe, OSDI'24), as ConfluxServe
§8.1 ran it: vLLM disaggregated serving with an NCCL KV connector and a 1:1 GPU split (TP2 +
TP2 on 4 GPUs, TP4 + TP4 on 8). See `prefill.py` and `decode.py` for the two pools and the KV
hand-off."""
from simserve.policies.distserve.policy import DistServeConfig, build  # noqa: F401
