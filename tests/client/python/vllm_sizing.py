"""How vLLM sizes its KV cache (Worker.determine_num_available_blocks of
vLLM 0.4-0.6, reduced to its arithmetic): profile a forward pass, then give
the cache what is left of `total * gpu_memory_utilization` after the peak.
It trusts torch.cuda.mem_get_info() for both figures, so a memory limit it
cannot see there is overrun (HAMi-core issue 181)."""


def determine_num_gpu_blocks(torch, block_bytes, gpu_memory_utilization, profile_run):
    torch.cuda.empty_cache()
    profile_run()
    torch.cuda.synchronize()
    free_gpu_memory, total_gpu_memory = torch.cuda.mem_get_info()
    peak_memory = total_gpu_memory - free_gpu_memory
    available_kv_cache_memory = total_gpu_memory * gpu_memory_utilization - peak_memory
    return max(int(available_kv_cache_memory // block_bytes), 0), total_gpu_memory
