// SPDX-License-Identifier: Apache-2.0
#pragma once

// Completion flags: where the per-slot "this point was reached" words live.
//
// A Flags object only places and owns the storage, one Word per slot; how a word is read
// and written is the Atomics policy's business (see core/atomics.hpp). HostFlags keeps
// the words in ordinary host memory, written by a thread that plays the device in tests.
// PinnedFlags<Driver> (reactor/pinned_flags.hpp) keeps them in page-locked memory the GPU
// writes with cuStreamWriteValue32; both store std::uint32_t, which StdAtomics reads
// through std::atomic_ref.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace xlogrt {

/// What SlotTable needs of a Flags type under the Atomics policy A: its size, and the
/// word of a slot, typed as the policy's flag_word.
template <class F, class A>
concept SlotFlags = requires(F& f, const F& cf, std::size_t slot) {
  { cf.size() } -> std::convertible_to<std::size_t>;
  { f.word(slot) } -> std::same_as<typename A::flag_word&>;
};

/// `size` flag words in host memory, each value-initialised (0: pending). Move-only.
///
/// Thread-safe. The words are read and written only through an Atomics policy; the object
/// itself is not modified after construction.
template <class Word = std::uint32_t>
class BasicHostFlags {
 public:
  explicit BasicHostFlags(std::size_t size)
      : words_(size == 0 ? nullptr : new Word[size]()), size_(size) {}

  std::size_t size() const noexcept { return size_; }

  /// @pre slot < size()
  Word& word(std::size_t slot) noexcept { return words_[slot]; }
  const Word& word(std::size_t slot) const noexcept { return words_[slot]; }

 private:
  std::unique_ptr<Word[]> words_;
  std::size_t size_;
};

/// The production host flags: plain 32-bit words, as StdAtomics reads them.
using HostFlags = BasicHostFlags<>;

}  // namespace xlogrt
