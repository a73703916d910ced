/* gpumem_hello: a C program built with pkg-config against the installed
 * libgpumem-dev: it connects to gpumemd ($GPUMEMD_SOCKET or the default
 * socket), allocates 1 MiB, writes and reads it back when the block is host
 * memory (the sim backend; on a GPU it is device memory, for CUDA kernels),
 * frees it, and says so.
 *
 *   cc gpumem_hello.c $(pkg-config --cflags --libs gpumem) -o gpumem_hello
 *   ./gpumem_hello
 */
#include <stdio.h>
#include <string.h>

#include <gpumem.h>

#define SIZE (1u << 20)

static int fail(const char* what) {
  fprintf(stderr, "gpumem_hello: %s: %s (%s)\n", what, gpumem_last_error_message(),
          gpumem_status_name(gpumem_last_error()));
  return 1;
}

int main(void) {
  gpumem_client* c = gpumem_connect(NULL);
  if (c == NULL) return fail("connect");
  void* p = NULL;
  if (gpumem_malloc(c, SIZE, NULL, &p) != 0) return fail("malloc");
  int ordinal = 0;
  if (gpumem_device_ordinal(c, p, &ordinal) != 0) return fail("device_ordinal");
  if (ordinal == -1) {
    unsigned char* bytes = p;
    for (size_t i = 0; i < SIZE; ++i) bytes[i] = (unsigned char)(i * 7 + 1);
    for (size_t i = 0; i < SIZE; ++i) {
      if (bytes[i] != (unsigned char)(i * 7 + 1)) {
        fprintf(stderr, "gpumem_hello: byte %zu reads back wrong\n", i);
        return 1;
      }
    }
  }
  int device = gpumem_device_of(c, p);
  if (gpumem_free(c, p) != 0) return fail("free");
  if (gpumem_close(c) != 0) return fail("close");
  printf("gpumem_hello: 1 MiB on device %d: %s, freed: ok\n", device,
         ordinal == -1 ? "written and read back" : "device memory (not touched from the host)");
  return 0;
}
