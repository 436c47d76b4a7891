// SPDX-License-Identifier: Apache-2.0
#pragma once

// find_layer<Layer>(stack): the first layer of a decorator stack that is a Layer<...>,
// found through upstream(), so that code reading one layer (Statistics' snapshot,
// Logging's flush) does not depend on how many layers sit above it; find_streams(stack):
// the base resource's stream pool, found the same way.

#include <type_traits>

namespace xlogrt {

namespace detail {
template <class T, template <class...> class Layer>
inline constexpr bool is_layer_v = false;
template <template <class...> class Layer, class... Args>
inline constexpr bool is_layer_v<Layer<Args...>, Layer> = true;
}  // namespace detail

/// A pointer to the outermost layer of `stack` (itself included) that is a Layer<...>,
/// e.g. `find_layer<Statistics>(rt.stack())->snapshot()`. A stack without such a layer
/// does not compile the call.
template <template <class...> class Layer, class Stack>
constexpr auto* find_layer(Stack& stack) noexcept {
  if constexpr (detail::is_layer_v<std::remove_const_t<Stack>, Layer>) {
    return &stack;
  } else {
    static_assert(requires { stack.upstream(); }, "find_layer: the stack has no such layer");
    return find_layer<Layer>(stack.upstream());
  }
}

/// The stream pool of the stack's base resource (the layer with streams(): AsyncCuda,
/// DirectCuda), found through upstream(): a pointer to that layer's shared_ptr, or a
/// null `const void*` where no layer exposes one (AnyResource erases it).
template <class Stack>
constexpr auto* find_streams(Stack& stack) noexcept {
  if constexpr (requires { stack.streams().get(); }) {
    return &stack.streams();
  } else if constexpr (requires { stack.upstream(); }) {
    return find_streams(stack.upstream());
  } else {
    return static_cast<const void*>(nullptr);
  }
}

}  // namespace xlogrt
