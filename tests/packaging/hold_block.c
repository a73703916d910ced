/* hold_block: a client that holds one block of gpumemd memory across what
 * the package test does to the daemon (upgrade, refused upgrade, remove).
 * Built outside the repository with pkg-config against libgpumem-dev.
 * Allocates 1 MiB, fills it with a pattern, prints "held DEVICE", then
 * answers lines on stdin:
 *   check  "intact GENERATION LOST_BYTES" (or "corrupt OFFSET"): the bytes,
 *          and gpumem_stats_json's generation and lost_bytes
 *   free   "freed STATUS" (0: the daemon took it back)
 *   quit   closes the client and exits 0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpumem.h>

#define SIZE (1u << 20)

static long long json_number(const char* json, const char* key) {
  const char* p = strstr(json, key);
  if (p == NULL) return -1;
  p = strchr(p, ':');
  return p == NULL ? -1 : strtoll(p + 1, NULL, 10);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  gpumem_client* c = gpumem_connect(NULL);
  if (c == NULL) {
    printf("error connect: %s\n", gpumem_last_error_message());
    return 1;
  }
  unsigned char* p = NULL;
  if (gpumem_malloc(c, SIZE, NULL, (void**)&p) != 0) {
    printf("error malloc: %s\n", gpumem_last_error_message());
    return 1;
  }
  for (size_t i = 0; i < SIZE; ++i) p[i] = (unsigned char)(i * 13 + 5);
  printf("held %d\n", gpumem_device_of(c, p));
  char line[64];
  while (fgets(line, sizeof line, stdin) != NULL) {
    if (strncmp(line, "check", 5) == 0) {
      size_t bad = SIZE;
      for (size_t i = 0; i < SIZE && bad == SIZE; ++i) {
        if (p[i] != (unsigned char)(i * 13 + 5)) bad = i;
      }
      char* json = NULL;
      if (gpumem_stats_json(c, &json) != 0) {
        printf("error stats: %s\n", gpumem_last_error_message());
        continue;
      }
      if (bad != SIZE) {
        printf("corrupt %zu\n", bad);
      } else {
        printf("intact %lld %lld\n", json_number(json, "\"generation\""),
               json_number(json, "\"lost_bytes\""));
      }
      gpumem_string_free(json);
    } else if (strncmp(line, "free", 4) == 0) {
      printf("freed %d\n", gpumem_free(c, p));
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    }
  }
  return gpumem_close(c) == 0 ? 0 : 1;
}
