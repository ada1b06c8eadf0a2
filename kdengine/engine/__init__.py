"""The decode engine: configs, MLA + MoE target, paged KV cache, DFlash-style drafter, DDTree trees,
acceptance, CUDA graphs, profiler and the `kdengine decode` benchmark (run_decode)."""
