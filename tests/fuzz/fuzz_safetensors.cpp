// libFuzzer target: SafetensorsFile::parse on arbitrary bytes (built and run by scripts/fuzz).
// A valid file must read consistently; anything else must be a CheckpointError. Any other
// exception escapes and aborts, which libFuzzer reports as a crash with the input saved.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "strata/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace strata::io;
    std::vector<std::byte> bytes(size);
    if (size) std::memcpy(bytes.data(), data, size);
    try {
        const auto f = SafetensorsFile::parse(std::move(bytes), "fuzz");
        std::uint64_t at = 0;
        for (const auto& t : f.tensors()) {
            // The reader's promise: the tensors tile the data buffer, each of its declared size.
            if (t.begin != at || t.end - t.begin != t.numel() * dtype_size(t.dtype)) std::abort();
            if (f.bytes(t.name).size() != t.byte_size()) std::abort();
            at = t.end;
        }
        for (const auto& [k, v] : f.metadata())
            if (f.metadata(k) != v) std::abort();
    } catch (const strata::CheckpointError&) {
    }
    return 0;
}
