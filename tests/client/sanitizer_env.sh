# Sourced by the tests that load libgpumem.so into programs Bazel did not
# build (python3, programs built with gcc). Under --config=asan/tsan the
# library needs its sanitizer's runtime loaded first: sanitizer_env LIB sets
# SANITIZER_CFLAGS (for gcc) and SANITIZER_PRELOAD (for python3) to match.
# Leak checking and race reports stay with tests/client:c_api_test, where the
# whole program is instrumented; here the runtime is only what lets the
# library run (TSan's reports from uninstrumented python3/gRPC are not ours).
sanitizer_env() {
  SANITIZER_CFLAGS="" SANITIZER_PRELOAD=""
  local needed
  needed=$(readelf -d "$1" | grep NEEDED || true)
  case "$needed" in
    *libasan*)
      SANITIZER_CFLAGS="-fsanitize=address,undefined"
      SANITIZER_PRELOAD=$(gcc -print-file-name=libasan.so)
      export ASAN_OPTIONS=detect_leaks=0
      ;;
    *libtsan*)
      SANITIZER_CFLAGS="-fsanitize=thread"
      SANITIZER_PRELOAD=$(gcc -print-file-name=libtsan.so)
      export TSAN_OPTIONS=report_bugs=0
      ;;
  esac
}
