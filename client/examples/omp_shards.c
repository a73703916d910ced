/* omp_shards: OpenMP offload over memory from gpumemd, one shard per device.
 *
 * One sharded allocation puts an array of N doubles across every device the
 * daemon has (shard i on its own device, all or nothing). Then one host
 * thread per device runs a target region on its own shard only, with the
 * shard's pointer used as a device pointer (is_device_ptr): no array is
 * copied to every device, unlike `map(tofrom: a[0:N])` on each device.
 * Each shard is copied back with omp_target_memcpy and the sum is checked
 * against its closed form (a[k] = 2k + 1, so the sum is N^2).
 *
 * Build: gcc -fopenmp -foffload=nvptx-none -Iclient omp_shards.c -lgpumem
 * Run:   GPUMEMD_SOCKET=/run/gpumemd/gpumemd.sock OMP_TARGET_OFFLOAD=MANDATORY ./omp_shards [N]
 * Exit status: 0 sum ok, 1 failure, 3 no OpenMP offload device for device memory.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpumem.h"

#define MAX_SHARDS 64

int main(int argc, char** argv) {
  size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)1 << 22;
  gpumem_client* c = gpumem_connect(NULL);
  if (c == NULL) {
    fprintf(stderr, "omp_shards: %s\n", gpumem_last_error_message());
    return 1;
  }
  int shards = gpumem_visible_device_count(c);
  if (shards <= 0 || shards > MAX_SHARDS) {
    fprintf(stderr, "omp_shards: device count %d: %s\n", shards, gpumem_last_error_message());
    return 1;
  }
  void* ptrs[MAX_SHARDS];
  size_t sizes[MAX_SHARDS];
  int devices[MAX_SHARDS];
  /* Whole elements per shard: ceil(n / shards) each, the last one partly used. */
  const size_t per = (n + (size_t)shards - 1) / (size_t)shards;
  if (gpumem_malloc_sharded(c, per * (size_t)shards * sizeof(double), (unsigned)shards, NULL,
                            ptrs, sizes, devices) != GPUMEM_OK) {
    fprintf(stderr, "omp_shards: %s: %s\n", gpumem_status_name(gpumem_last_error()),
            gpumem_last_error_message());
    return 1;
  }
  /* Shard s holds elements [first[s], first[s] + count[s]). */
  size_t first[MAX_SHARDS], count[MAX_SHARDS], at = 0;
  for (int s = 0; s < shards; ++s) {
    first[s] = at;
    count[s] = n - at < per ? n - at : per;
    at += count[s];
    for (int t = 0; t < s; ++t) {
      if (devices[t] == devices[s]) {
        fprintf(stderr, "omp_shards: shards %d and %d share device %d\n", t, s, devices[s]);
        return 1;
      }
    }
    if (sizes[s] < count[s] * sizeof(double)) {
      fprintf(stderr, "omp_shards: shard %d holds %zu bytes, too few\n", s, sizes[s]);
      return 1;
    }
  }
  const int host = omp_get_initial_device();
  const int visible = omp_get_num_devices();
  /* The OpenMP device of each shard: gpumem_device_ordinal says where the
   * shard is in this process's numbering. Device memory (a CUDA daemon) has
   * a CUDA ordinal, which is the OpenMP device number when the program is
   * built for one GPU offload target (gcc -foffload=nvptx-none: libgomp's
   * nvptx plugin numbers devices as the CUDA driver does); the region must
   * run there, because the host cannot touch device memory. When OpenMP has
   * no such device (no offload support built in or installed, or
   * OMP_TARGET_OFFLOAD=DISABLED) the example says so and exits with status 3
   * rather than run the region on the host over device pointers. Host memory
   * (the sim backend, ordinal -1) runs on the host device. */
  int target[MAX_SHARDS];
  for (int s = 0; s < shards; ++s) {
    int ordinal = -1;
    if (gpumem_device_ordinal(c, ptrs[s], &ordinal) != GPUMEM_OK) {
      fprintf(stderr, "omp_shards: shard %d: %s: %s\n", s,
              gpumem_status_name(gpumem_last_error()), gpumem_last_error_message());
      return 1;
    }
    if (ordinal >= 0 && ordinal >= visible) {
      fprintf(stderr,
              "omp_shards: no OpenMP offload device for shard %d (CUDA device %d of this "
              "process; OpenMP sees %d offload device%s): device memory cannot be used on the "
              "host; build with -foffload=nvptx-none and run where the offload plugin is "
              "installed\n",
              s, ordinal, visible, visible == 1 ? "" : "s");
      for (int t = 0; t < shards; ++t) gpumem_free(c, ptrs[t]);
      gpumem_close(c);
      return 3;
    }
    target[s] = ordinal >= 0 ? ordinal : host;
  }
  double sum = 0;
  int failed = 0;
#pragma omp parallel num_threads(shards) reduction(+ : sum) reduction(| : failed)
  {
    const int s = omp_get_thread_num();
    const int dev = target[s];
    double* p = (double*)ptrs[s];
    const size_t m = count[s], base = first[s];
#pragma omp target teams distribute parallel for is_device_ptr(p) device(dev)
    for (size_t i = 0; i < m; ++i) p[i] = 2.0 * (double)(base + i) + 1.0;
    double* back = malloc(m * sizeof(double));
    if (back == NULL || omp_target_memcpy(back, p, m * sizeof(double), 0, 0, host, dev) != 0) {
      failed = 1;
    } else {
      for (size_t i = 0; i < m; ++i) sum += back[i];
    }
    free(back);
  }
  for (int s = 0; s < shards; ++s) {
    if (gpumem_free(c, ptrs[s]) != GPUMEM_OK) {
      fprintf(stderr, "omp_shards: free: %s\n", gpumem_last_error_message());
      failed = 1;
    }
  }
  gpumem_close(c);
  const double want = (double)n * (double)n;
  if (failed || sum != want) {
    fprintf(stderr, "omp_shards: sum %.0f, expected %.0f\n", sum, want);
    return 1;
  }
  printf("omp_shards: %zu doubles in %d shards on %d devices (OpenMP devices: %d): sum ok\n", n,
         shards, shards, visible);
  return 0;
}
