// libFuzzer target: the IDX reader on arbitrary bytes (built and run by scripts/fuzz). The
// reader takes a path, so each input goes to an in-memory file (memfd) read through /proc.
// Every outcome must be a correct read or an IoError from the header check; anything else aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "strata/io/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const int fd = ::memfd_create("idx", 0);
    static const std::string path = "/proc/self/fd/" + std::to_string(fd);
    if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();
    if (size && ::pwrite(fd, data, size, 0) != static_cast<::ssize_t>(size)) std::abort();
    strata::io::IdxHeader h;
    try {
        h = strata::io::read_idx_header(path);
    } catch (const strata::IoError&) {
        return 0;
    }
    // A valid header promises the file holds exactly the elements its dimensions describe, and
    // then the reads must succeed: an IoError from here on escapes and is reported.
    if (h.data_offset + h.element_count() * strata::io::idx_type_size(h.type) != size) std::abort();
    const auto a = strata::io::read_idx<double>(path);
    if (a.dims != h.dims || a.data.size() != h.element_count()) std::abort();
    if (h.type == strata::io::IdxType::Float32 || h.type == strata::io::IdxType::Float64) return 0;
    const auto b = strata::io::read_idx<std::int32_t>(path);  // every integer IDX type fits
    if (b.data.size() != a.data.size()) std::abort();
    for (std::size_t i = 0; i < b.data.size(); ++i)
        if (double(b.data[i]) != a.data[i]) std::abort();
    return 0;
}
