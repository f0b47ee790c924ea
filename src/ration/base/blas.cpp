// blas.cpp — OpenBLAS's core, the CPU's features, one re-execution with a better core (see blas.h).
#include "ration/base/blas.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ration::blas {
namespace {

template <typename Fn>
Fn lookup(const char* symbol) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, symbol));
}

// Cores of OpenBLAS's dynamic-arch builds that use AVX2 (or wider) kernels.
bool uses_avx2(const std::string& core) {
  for (const char* c : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "Excavator"})
    if (core == c) return true;
  return false;
}

bool pretend_generic() {
  const char* v = std::getenv("RATION_BLAS_PRETEND_GENERIC");
  return v != nullptr && std::strcmp(v, "1") == 0 && std::getenv("RATION_BLAS_SELECTED") == nullptr;
}

}  // namespace

std::string core() {
  auto fn = lookup<char* (*)()>("openblas_get_corename");
  if (fn == nullptr) return {};
  const char* name = fn();
  std::string s = name ? name : "";
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s;
}

int threads() {
  auto fn = lookup<int (*)()>("openblas_get_num_threads");
  return fn ? fn() : 0;
}

std::string best_core_for_cpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return {};
}

bool leaves_vector_units_unused(const std::string& name) {
  if (name.empty() || best_core_for_cpu().empty()) return false;
  return pretend_generic() || !uses_avx2(name);
}

std::string chosen_by() {
  if (std::getenv("RATION_BLAS_SELECTED") != nullptr) return "ration";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "user";
  return "library";
}

void select_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("RATION_BLAS_SELECTED") != nullptr) return;
  const std::string now = core();
  if (!leaves_vector_units_unused(now)) return;
  const std::string best = best_core_for_cpu();
  setenv("OPENBLAS_CORETYPE", best.c_str(), 1);
  setenv("RATION_BLAS_SELECTED", now.c_str(), 1);  // the library's own pick, for the report
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "warning: OpenBLAS chose its generic '%s' kernels on this %s-capable CPU and restarting with "
               "OPENBLAS_CORETYPE=%s failed (%s); matmuls will be slower (set OPENBLAS_CORETYPE yourself)\n",
               now.c_str(), best.c_str(), best.c_str(), std::strerror(errno));
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("RATION_BLAS_SELECTED");
}

}  // namespace ration::blas
