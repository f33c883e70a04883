"""The mini test's ``--dry-check``: the imports and the megatron-core API shapes it relies on, checked
without CUDA; one JSON report on stdout."""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict

import torch
from report import te_version
from settings import EXIT_FAILED, EXIT_OK, Settings


def dry_check(s: Settings) -> int:
    """Imports and API shapes this test relies on, checked without CUDA."""
    report: dict = {"test": "gtp_refit_mini", "dry_check": True, "settings": asdict(s), "problems": []}
    problems = report["problems"]

    def need(cond, message):
        if not cond:
            problems.append(message)

    try:
        from megatron.core import dist_checkpointing, parallel_state  # noqa: F401
        from megatron.core.distributed import (  # noqa: F401
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.inference.shards import build_inference_pg_collection
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: F401
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.resharding import refit as mcore_refit
        from megatron.core.tensor_parallel import gtp_api
        from megatron.core.tensor_parallel.generalized_tensor_parallelism import (  # noqa: F401
            GTP_CONFIG,
            get_global_GTP_cache,
            reset_gtp_state,
        )
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: F401
        from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        problems.append(f"import failed: {type(exc).__name__}: {exc}")
        print(json.dumps(report, sort_keys=True))
        return EXIT_FAILED
    init_params = inspect.signature(parallel_state.initialize_model_parallel).parameters
    need("gtp_remat_size" in init_params, "initialize_model_parallel() takes no gtp_remat_size")
    if s.experts:
        need("expert_gtp_remat_size" in init_params, "initialize_model_parallel() takes no expert_gtp_remat_size")
        spec_params = inspect.signature(get_gpt_layer_with_transformer_engine_spec).parameters
        need("num_experts" in spec_params and "moe_grouped_gemm" in spec_params,
             "get_gpt_layer_with_transformer_engine_spec() takes no num_experts / moe_grouped_gemm")
    need("pg_collection" in inspect.signature(GPTModel.__init__).parameters, "GPTModel() takes no pg_collection")
    sig = inspect.signature(build_inference_pg_collection).parameters
    need(all(k in sig for k in ("world_size", "tp_size", "pp_size", "cp_size", "ep_size", "expt_tp_size")),
         f"build_inference_pg_collection() parameters are {list(sig)}")
    fields = TransformerConfig.__dataclass_fields__
    need("tensor_parallel_num_weight_shards" in fields, "TransformerConfig has no tensor_parallel_num_weight_shards")
    if s.experts:
        need(all(k in fields for k in ("expert_tensor_parallel_num_weight_shards", "num_moe_experts",
                                        "moe_router_topk", "moe_ffn_hidden_size", "moe_grouped_gemm")),
             "TransformerConfig lacks an expert field the test sets")
        need("expt_gtp_remat" in ProcessGroupCollection.__dataclass_fields__,
             "ProcessGroupCollection has no expt_gtp_remat field")
    need("gtp_remat" in ProcessGroupCollection.__dataclass_fields__, "ProcessGroupCollection has no gtp_remat field")
    opt_fields = OptimizerConfig.__dataclass_fields__
    need(all(k in opt_fields for k in ("use_distributed_optimizer", "use_precision_aware_optimizer", "clip_grad")),
         "OptimizerConfig lacks a field the test sets")
    for attr in ("enable_forward_pre_hook", "disable_forward_pre_hook", "zero_grad_buffer"):
        need(hasattr(DistributedDataParallel, attr), f"DistributedDataParallel has no {attr}")
    for attr in ("HAVE_GTP", "is_gtp_param", "classify_gtp_remat_chains"):
        need(hasattr(gtp_api, attr), f"gtp_api has no {attr}")
    for attr in ("prepare_swap_model_weights", "swap_model_weights", "clear_all_caches"):
        need(hasattr(mcore_refit, attr), f"megatron.core.resharding.refit has no {attr}")
    for attr in ("weight_prefetch", "async_reduction"):
        need(hasattr(GTP_CONFIG, attr), f"GTP config has no {attr}")
    report["gtp_defaults"] = {"weight_prefetch": GTP_CONFIG.weight_prefetch,
                              "async_reduction": GTP_CONFIG.async_reduction}
    report["transformer_engine"] = te_version()
    report["have_gtp"] = bool(getattr(gtp_api, "HAVE_GTP", False))
    report["cuda"] = torch.cuda.is_available()
    report["ok"] = not problems
    print(json.dumps(report, sort_keys=True))
    return EXIT_OK if not problems else EXIT_FAILED
