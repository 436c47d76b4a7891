#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sourced by test/run.sh and bench/tour.sh: checks what building xlogrt needs, installs
# the Debian packages when run as root, and otherwise says exactly what is missing.

xlogrt_prereqs() {
  local missing=() need_pkgs=()
  command -v meson >/dev/null || need_pkgs+=(meson)
  command -v ninja >/dev/null || need_pkgs+=(ninja-build)
  command -v g++ >/dev/null || need_pkgs+=(g++)
  command -v pkg-config >/dev/null || need_pkgs+=(pkg-config)
  [ -f /usr/include/catch2/catch.hpp ] || need_pkgs+=(catch2)
  [ -f /usr/include/relacy/relacy.hpp ] || need_pkgs+=(relacy-dev)
  if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "xlogrt: installing Debian packages: ${need_pkgs[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null ||
        { echo "xlogrt: apt-get install ${need_pkgs[*]} failed" >&2; return 1; }
    else
      # Catch2 alone is not fatal: Meson falls back to subprojects/catch2.wrap (which
      # downloads the release once) when the system has no Catch2 v2.
      local fatal=()
      for p in "${need_pkgs[@]}"; do [ "$p" = catch2 ] || fatal+=("$p"); done
      if [ ${#fatal[@]} -lt ${#need_pkgs[@]} ]; then
        echo "xlogrt: no system Catch2 v2 (sudo apt-get install catch2): Meson will fetch it through subprojects/catch2.wrap"
      fi
      [ ${#fatal[@]} -eq 0 ] ||
        missing+=("Debian packages: ${need_pkgs[*]} (sudo apt-get install ${need_pkgs[*]})")
    fi
  fi
  local cuda_h=""
  for d in "${CUDA_PATH:-}/include" /usr/local/cuda/include; do
    [ -f "$d/cuda.h" ] && { cuda_h="$d/cuda.h"; break; }
  done
  [ -n "$cuda_h" ] || missing+=("the CUDA Toolkit headers (cuda.h in /usr/local/cuda/include or \$CUDA_PATH/include); no GPU or driver is needed to build")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "xlogrt: cannot build, missing:" >&2
    printf '  - %s\n' "${missing[@]}" >&2
    return 1
  fi
}

# What test/fuzz/run.sh needs beyond the build: clang++ with libFuzzer (Debian clang).
xlogrt_fuzz_prereqs() {
  command -v clang++ >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "xlogrt: installing Debian packages: clang"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null ||
      { echo "xlogrt: apt-get install clang failed" >&2; return 1; }
  else
    echo "xlogrt: fuzzing needs clang++ with libFuzzer (sudo apt-get install clang)" >&2
    return 1
  fi
}
