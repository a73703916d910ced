/* A plain C99 program on libgpumem.so: the header compiles as C with every
 * warning an error, and the documented codes come back through the shared
 * library. Prints "c_program: ok" and exits 0, or names the first failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "c_program: line %d: %s (last error %s: %s)\n", __LINE__, \
              #cond, gpumem_status_name(gpumem_last_error()),                    \
              gpumem_last_error_message());                                      \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main(void) {
  gpumem_client* c = gpumem_connect(NULL);
  CHECK(c != NULL);
  void* p = NULL;
  CHECK(gpumem_malloc(c, 1000, NULL, &p) == GPUMEM_OK);
  memset(p, 0xab, 1000);
  CHECK(((unsigned char*)p)[999] == 0xab);

  const char* fallback[1] = {"all"};
  gpumem_placement where;
  memset(&where, 0, sizeof(where));
  where.gpus = "1";
  where.fallback = fallback;
  where.fallback_count = 1;
  where.policy = "pack";
  void* q = NULL;
  CHECK(gpumem_malloc(c, 70000, &where, &q) == GPUMEM_OK);
  CHECK(gpumem_device_of(c, q) == 1);
  void* r = NULL;
  CHECK(gpumem_malloc_str(c, 5000, "--gpus=0 --policy=least-loaded", &r) == GPUMEM_OK);
  CHECK(gpumem_device_of(c, r) == 0);

  char* json = NULL;
  CHECK(gpumem_stats_json(c, &json) == GPUMEM_OK);
  CHECK(strstr(json, "\"leased_bytes\":") != NULL);
  CHECK(strstr(json, "\"daemon\":") != NULL);
  gpumem_string_free(json);

  CHECK(gpumem_free(c, p) == GPUMEM_OK);
  CHECK(gpumem_free(c, p) == GPUMEM_E_DOUBLE_FREE);
  CHECK(gpumem_last_error() == GPUMEM_E_DOUBLE_FREE);
  int local = 0;
  CHECK(gpumem_free(c, &local) == GPUMEM_E_FOREIGN_POINTER);
  CHECK(gpumem_malloc(c, 0, NULL, &p) == GPUMEM_E_INVALID_ARGUMENT);
  CHECK(gpumem_malloc_str(c, 10, "--policy=sideways", &p) == GPUMEM_E_INVALID_ARGUMENT);
  CHECK(gpumem_free(c, q) == GPUMEM_OK);
  CHECK(gpumem_free(c, r) == GPUMEM_OK);
  size_t released = 0;
  CHECK(gpumem_trim(c, &released) == GPUMEM_OK);
  CHECK(released > 0);
  CHECK(gpumem_close(c) == GPUMEM_OK);
  CHECK(gpumem_malloc(c, 10, NULL, &p) == GPUMEM_E_CLOSED);
  CHECK(strcmp(gpumem_status_name(GPUMEM_E_CLOSED), "GPUMEM_E_CLOSED") == 0);
  printf("c_program: ok\n");
  return 0;
}
